#!/usr/bin/env bash
# The Debian 13 (trixie) build root of `make check-gpu-build`: LibTorch 2.6 with CUDA and NCCL.
#
#   scripts/debian13-root.sh ensure            create the root, or reuse it; print its path
#   scripts/debian13-root.sh run CMD [ARG...]  run CMD inside it, in the current directory
#   scripts/debian13-root.sh sources           print the apt sources the root is given
#   scripts/debian13-root.sh packages          print the package list's names (the Dockerfile's)
#
# The root is cached on the machine, outside the repository, in $TRAINSTEP_DEBIAN13_ROOT
# (default /var/cache/trainstep/debian13). It is stamped with a hash of the package list
# (deploy/debian13-packages.txt) and made anew when the list changes; the downloaded .debs
# stay in $TRAINSTEP_DEBIAN13_DEBS (default /var/cache/trainstep/debian13-debs) for that.
#
# Where packages come from: debootstrap's own default archive (no mirror argument), then the
# host's apt configuration (/etc/apt/sources.list, sources.list.d/*.list, *.sources) with its
# release name replaced by trixie and the components main contrib non-free. No host name is
# written here or copied into the root.
#
# `run` binds the repository at its own path (so build directories are valid inside and out),
# the ccache directory $TRAINSTEP_DEBIAN13_CCACHE (default /var/cache/trainstep/ccache-debian13)
# at /ccache, a fresh /tmp, /dev and /proc. Every mount lives in a private mount namespace
# (unshare), so nothing outlives the command even when it is killed; the trap unmounts anyway.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
LIST="$REPO/deploy/debian13-packages.txt"
ROOT=${TRAINSTEP_DEBIAN13_ROOT:-/var/cache/trainstep/debian13}
CCACHE=${TRAINSTEP_DEBIAN13_CCACHE:-/var/cache/trainstep/ccache-debian13}
# Downloaded .deb files, kept beside the root: a refresh fetches only what changed.
DEBS=${TRAINSTEP_DEBIAN13_DEBS:-/var/cache/trainstep/debian13-debs}
SUITE=trixie
COMPONENTS="main contrib non-free"
# Bump when the way the root is made changes (not the list): forces a fresh root.
RECIPE=3

log() { echo "debian13-root: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

require_root() {
  [ "$(id -u)" -eq 0 ] && return
  command -v sudo >/dev/null || die "needs root (debootstrap, chroot, mounts) and there is no sudo"
  exec sudo --preserve-env=TRAINSTEP_DEBIAN13_ROOT,TRAINSTEP_DEBIAN13_CCACHE "$0" "$@"
}

# The package names of the list, one per line, sorted: comments and order do not matter.
packages() {
  [ -r "$LIST" ] || die "cannot read the package list $LIST"
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "$LIST" | grep -v '^$' | sort -u
}

stamp() { { echo "recipe $RECIPE suite $SUITE"; packages; } | sha256sum | cut -d' ' -f1; }

# Prints, in deb822 form, every Debian entry of the host's apt configuration moved to trixie:
# a suite is kept when it is the host's release or one of its -updates/-security/... pockets.
sources() {
  local host_release
  host_release=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$host_release" ] || die "/etc/os-release names no VERSION_CODENAME"
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  local f
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || die "no apt sources in /etc/apt"
  awk -v host="$host_release" -v suite="$SUITE" -v comps="$COMPONENTS" '
    function emit(uris, suites,   n, i, s, out, seen) {
      n = split(suites, s, /[[:space:]]+/); out = ""
      for (i = 1; i <= n; i++) {
        if (s[i] != host && index(s[i], host "-") != 1) continue
        sub("^" host, suite, s[i])
        if (!(s[i] in seen)) { seen[s[i]] = 1; out = out (out == "" ? "" : " ") s[i] }
      }
      if (out == "" || uris == "") return
      key = uris "|" out
      if (key in printed) return
      printed[key] = 1
      printf "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n\n", uris, out, comps
      found = 1
    }
    function flush() {
      if (para && enabled != "no" && types ~ /(^|[[:space:]])deb([[:space:]]|$)/) emit(uris, suites)
      para = 0; types = ""; uris = ""; suites = ""; enabled = ""
    }
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[[:space:]]*$/) { flush(); next }
      if ($0 ~ /^#/) next
      para = 1
      line = $0; field = tolower(line); sub(/:.*/, "", field)
      value = line; sub(/^[^:]*:[[:space:]]*/, "", value)
      if (field == "types") types = value
      else if (field == "uris") uris = value
      else if (field == "suites") suites = value
      else if (field == "enabled") enabled = tolower(value)
      next
    }
    FNR == 1 { flush() }
    {
      line = $0; sub(/#.*/, "", line)
      n = split(line, w, /[[:space:]]+/)
      i = 1; if (w[i] == "") i++
      if (w[i] != "deb") next
      i++
      if (w[i] ~ /^\[/) { while (i <= n && w[i] !~ /\]$/) i++; i++ }
      if (i + 1 <= n) emit(w[i], w[i + 1])
    }
    END { flush(); if (!found) exit 3 }
  ' "${files[@]}" || die "the host's apt configuration has no Debian '$host_release' entry to move to $SUITE"
}

# Fails when anything is mounted at or under $1: it must never be removed with a mount inside.
assert_unmounted() {
  local dir
  dir=$(readlink -f "$1")
  if awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { bad = 1 } END { exit !bad }' \
    /proc/self/mountinfo; then
    die "something is still mounted under $dir; refusing to remove it"
  fi
}

remove_tree() {
  [ -e "$1" ] || return 0
  assert_unmounted "$1"
  rm -rf --one-file-system "$1"
}

# in_root DIR CMD...: CMD in the chroot DIR, in a private mount namespace with /proc, /dev,
# the host's resolver (for apt), a fresh /tmp and, when BIND_REPO=1, the repository and ccache.
in_root() {
  local dir=$1
  shift
  local tmp
  tmp=$(mktemp -d /tmp/trainstep-debian13-tmp.XXXXXX)
  chmod 1777 "$tmp"
  # The namespace takes its mounts with it; the trap also removes the private /tmp.
  local rc=0
  unshare --mount --propagation private -- bash -euo pipefail -c '
    dir=$1 tmp=$2 repo=$3 ccache=$4 bind_repo=$5 workdir=$6 debs=$7
    shift 7
    mounted=()
    cleanup() {
      local i
      for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
    }
    trap cleanup EXIT
    mnt() { local target=${!#}; mount "$@"; mounted+=("$target"); }
    mnt -t proc proc "$dir/proc"
    mnt --rbind /dev "$dir/dev"
    mnt --bind "$tmp" "$dir/tmp"
    if [ -e /etc/resolv.conf ]; then
      touch "$dir/etc/resolv.conf"
      mnt --bind -o ro "$(readlink -f /etc/resolv.conf)" "$dir/etc/resolv.conf"
    fi
    if [ -n "$debs" ]; then
      mnt --bind "$debs" "$dir/var/cache/apt/archives"
    fi
    if [ "$bind_repo" = 1 ]; then
      mkdir -p "$dir$repo" "$dir/ccache"
      mnt --bind "$repo" "$dir$repo"
      mnt --bind "$ccache" "$dir/ccache"
    fi
    chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      DEBIAN_FRONTEND=noninteractive CCACHE_DIR=/ccache CCACHE_BASEDIR="$repo" \
      TRAINSTEP_IN_DEBIAN13_ROOT=1 \
      bash -c "cd \"\$0\" && exec \"\$@\"" "$workdir" "$@"
  ' in_root "$dir" "$tmp" "$REPO" "$CCACHE" "${BIND_REPO:-0}" "${WORKDIR:-/}" "${BIND_DEBS:-}" "$@" || rc=$?
  rm -rf "$tmp"
  return $rc
}

# LibTorch's CUDA libraries are linked with BIND_NOW against libcudnn.so.9, so without it no
# worker or test can even start. Without cuDNN, the root gets a libcudnn.so.9 in /usr/local/lib
# that defines every cudnn* function those libraries use; each one stops the process with a
# message saying cuDNN is not installed. Nothing reaches them without a GPU.
install_cudnn_placeholder() {
  local dir=$1
  # shellcheck disable=SC2016
  apt_in_root bash -euo pipefail -c '
    ls /usr/lib/x86_64-linux-gnu/libcudnn.so.9.* >/dev/null 2>&1 && exit 0  # the real one
    syms=$(for f in /usr/lib/x86_64-linux-gnu/lib*.so.*; do
             [ -L "$f" ] && continue
             readelf -d "$f" 2>/dev/null | grep -q "NEEDED.*\[libcudnn\.so\.9\]" || continue
             nm -D --undefined-only "$f" | awk "\$2 ~ /^cudnn/ { print \$2 }"
           done | sed "s/@.*//" | sort -u)
    [ -n "$syms" ] || { echo "no library needs libcudnn.so.9" >&2; exit 1; }
    {
      echo "#include <stdio.h>"
      echo "#include <stdlib.h>"
      echo "static void missing(const char* f) {"
      echo "  fprintf(stderr, \"%s: cuDNN is not installed in this build root (no GPU here; see scripts/debian13-root.sh)\\n\", f);"
      echo "  abort();"
      echo "}"
      for s in $syms; do echo "void $s(void) { missing(\"$s\"); }"; done
    } >/tmp/cudnn-placeholder.c
    # The users bind to version node libcudnn.so.9 (cudnnCreate@libcudnn.so.9).
    echo "libcudnn.so.9 { global: *; };" >/tmp/cudnn-placeholder.map
    gcc -shared -fPIC -O1 -Wl,-soname,libcudnn.so.9 \
      -Wl,--version-script=/tmp/cudnn-placeholder.map -o /usr/local/lib/libcudnn.so.9 \
      /tmp/cudnn-placeholder.c
    ldconfig
    echo "libcudnn.so.9 placeholder: $(echo "$syms" | wc -l) functions"
  '
  log "cuDNN not downloaded; $(tail -1 "$dir.apt.log")"
}

# Makes a fresh root in $1: debootstrap, apt sources, the package list. Prints phase timings.
create_root() {
  local dir=$1 t0 t1 t2 t3
  command -v debootstrap >/dev/null || die "debootstrap is missing (scripts/install-deps.sh installs it)"
  mkdir -p "$(dirname "$dir")"
  t0=$(date +%s)
  log "debootstrap --variant=minbase $SUITE (debootstrap's default archive) into $dir"
  # Its own /proc mount and chroot calls stay in this private namespace.
  unshare --mount --propagation private -- \
    debootstrap --variant=minbase "$SUITE" "$dir" >"$dir.debootstrap.log" 2>&1 ||
    { tail -20 "$dir.debootstrap.log" >&2; die "debootstrap failed (log: $dir.debootstrap.log)"; }
  rm -f "$dir.debootstrap.log"
  # debootstrap copies the host's name and resolver; the root keeps neither.
  rm -f "$dir/etc/hostname" "$dir/etc/resolv.conf"
  rm -f "$dir/etc/apt/sources.list"
  # ~8 GB to unpack into a root that is thrown away on any failure: no fsync per file.
  echo force-unsafe-io >"$dir/etc/dpkg/dpkg.cfg.d/trainstep-unsafe-io"
  sources >"$dir/etc/apt/sources.list.d/debian.sources"
  # No service may start inside a build root.
  printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
  chmod 755 "$dir/usr/sbin/policy-rc.d"
  t1=$(date +%s)
  log "debootstrap: $((t1 - t0)) s"
  local pkgs apt_log="$dir.apt.log"
  mapfile -t pkgs < <(packages)
  mkdir -p "$DEBS/partial"
  apt_in_root() {
    BIND_DEBS=$DEBS in_root "$dir" "$@" >>"$apt_log" 2>&1 ||
      { tail -40 "$apt_log" >&2; die "'$*' failed in the root (log: $apt_log)"; }
  }
  : >"$apt_log"
  apt_in_root apt-get update
  apt_in_root apt-get install -y --no-install-recommends --download-only "${pkgs[@]}"
  t2=$(date +%s)
  log "download of ${#pkgs[@]} packages and their dependencies: $((t2 - t1)) s ($(du -sh "$DEBS" | cut -f1) of .debs in $DEBS)"
  # cuDNN: Debian has only a downloader for it (nvidia-cudnn, which fetches it from NVIDIA's
  # servers when its licence question is answered "I Agree"). The root does not download it:
  # it has no GPU to run cuDNN on, and CI machines reach Debian's archive only.
  echo "nvidia-cudnn nvidia-cudnn/question select I Decline" |
    apt_in_root debconf-set-selections
  apt_in_root apt-get install -y --no-install-recommends "${pkgs[@]}"
  install_cudnn_placeholder "$dir"
  rm -f "$apt_log"
  t3=$(date +%s)
  log "unpack + configure: $((t3 - t2)) s; root size $(du -sh --one-file-system "$dir" | cut -f1)"
  log "fresh root: $((t3 - t0)) s in all"
}

ensure() {
  local want lock
  want=$(stamp)
  mkdir -p "$(dirname "$ROOT")" "$CCACHE"
  lock="$ROOT.lock"
  exec 9>"$lock"
  flock 9
  if [ -f "$ROOT/.trainstep-stamp" ] && [ "$(cat "$ROOT/.trainstep-stamp")" = "$want" ]; then
    log "reusing $ROOT (package list unchanged)"
    echo "$ROOT"
    return
  fi
  [ -d "$ROOT" ] && log "the package list changed: making $ROOT anew"
  local new="$ROOT.new"
  remove_tree "$new"
  # An interrupted creation leaves nothing half-made behind.
  trap 'rc=$?; [ $rc -ne 0 ] && remove_tree "'"$new"'"; exit $rc' EXIT
  create_root "$new"
  echo "$want" >"$new/.trainstep-stamp"
  remove_tree "$ROOT.old"
  [ -d "$ROOT" ] && mv "$ROOT" "$ROOT.old"
  mv "$new" "$ROOT"
  trap - EXIT
  remove_tree "$ROOT.old"
  echo "$ROOT"
}

run() {
  [ $# -gt 0 ] || usage
  [ -f "$ROOT/.trainstep-stamp" ] || die "no root at $ROOT: run '$0 ensure' first"
  [ "$(cat "$ROOT/.trainstep-stamp")" = "$(stamp)" ] ||
    die "the root at $ROOT is stale (the package list changed): run '$0 ensure'"
  mkdir -p "$CCACHE"
  local workdir
  workdir=$(pwd)
  case "$workdir" in
    "$REPO" | "$REPO"/*) ;;
    *) die "run it from inside the repository ($REPO): only that is visible in the root" ;;
  esac
  # A shared lock: `ensure` cannot swap the root away under a running build.
  exec 9>"$ROOT.lock"
  flock -s 9
  BIND_REPO=1 WORKDIR=$workdir in_root "$ROOT" "$@"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  ensure) require_root ensure "$@"; ensure ;;
  run) require_root run "$@"; run "$@" ;;
  sources) sources ;;
  packages) packages ;;
  *) usage ;;
esac
