/* LD_PRELOAD shim for the chaos tool: fsync() and fdatasync() fail with EIO while the file
 * named by $TRAINSTEP_CHAOS_FSYNC_FAIL exists, and behave normally otherwise. It gives the
 * coordinator's journal a failing disk from outside the process, which no flag can (the
 * coordinator's fault-injecting Env exists only in unit tests). chaos.py builds it with cc
 * into its output directory: cc -shared -fPIC -O2 -o fsync_fault.so fsync_fault.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static int failing(void) {
  const char* trigger = getenv("TRAINSTEP_CHAOS_FSYNC_FAIL");
  return trigger != NULL && trigger[0] != '\0' && access(trigger, F_OK) == 0;
}

int fsync(int fd) {
  static int (*real)(int) = NULL;
  if (failing()) {
    errno = EIO;
    return -1;
  }
  if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  return real(fd);
}

int fdatasync(int fd) {
  static int (*real)(int) = NULL;
  if (failing()) {
    errno = EIO;
    return -1;
  }
  if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  return real(fd);
}
