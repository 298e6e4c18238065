// The worker's thread count: cores / local workers by default, a flag or OMP_NUM_THREADS
// when given, the cgroup CPU limit respected, bad values named.
#include "worker/host/threads.h"

#include <gtest/gtest.h>

namespace trainstep {
namespace {

ThreadSources Host(int cpus, const std::string& local_world_size = "") {
  ThreadSources in;
  in.affinity_cpus = cpus;
  in.local_world_size = local_world_size;
  return in;
}

// Catches: every worker taking every core (L workers × C threads on C cores).
TEST(PlanThreadsTest, SplitsTheCoresBetweenTheLocalWorkers) {
  absl::StatusOr<ThreadPlan> p = PlanThreads(Host(2, "2"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->threads, 1);
  EXPECT_EQ(p->cores, 2);
  EXPECT_EQ(p->local_workers, 2);
  EXPECT_NE(p->why.find("LOCAL_WORLD_SIZE"), std::string::npos) << p->why;

  p = PlanThreads(Host(16, "4"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->threads, 4);
  p = PlanThreads(Host(7, "2"));  // rounds down: 2 × 3 threads fit 7 cores
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->threads, 3);
  p = PlanThreads(Host(8));  // one worker on the host by default
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->threads, 8);
  EXPECT_EQ(p->local_workers, 1);
}

// Catches: zero threads when workers outnumber cores.
TEST(PlanThreadsTest, AtLeastOneThreadWhenWorkersOutnumberCores) {
  absl::StatusOr<ThreadPlan> p = PlanThreads(Host(2, "4"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->threads, 1);
  EXPECT_NE(p->why.find("more workers than cores"), std::string::npos) << p->why;
}

// Catches: a container limited to 2 CPUs (cgroup quota) still taking all 64 host cores.
TEST(PlanThreadsTest, TheCgroupCpuLimitCapsTheCores) {
  ThreadSources in = Host(64);
  in.cgroup_cpu_max = "200000 100000\n";
  absl::StatusOr<ThreadPlan> p = PlanThreads(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cores, 2);
  EXPECT_EQ(p->threads, 2);
  EXPECT_NE(p->why.find("cgroup"), std::string::npos) << p->why;

  in.cgroup_cpu_max = "250000 100000";  // 2.5 CPUs: a third thread would be throttled
  p = PlanThreads(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->cores, 2);
  in.cgroup_cpu_max = "50000 100000";  // half a CPU still runs one thread
  p = PlanThreads(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->cores, 1);

  in.cgroup_cpu_max = "max 100000";
  p = PlanThreads(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->cores, 64);

  in.cgroup_cpu_max = "lots";
  EXPECT_EQ(PlanThreads(in).status().code(), absl::StatusCode::kInvalidArgument);
}

// Catches: the flag or OMP_NUM_THREADS ignored, or OMP_NUM_THREADS winning over the flag.
TEST(PlanThreadsTest, FlagThenOmpNumThreadsThenAutomatic) {
  ThreadSources in = Host(8, "2");
  in.omp_num_threads = "3";
  absl::StatusOr<ThreadPlan> p = PlanThreads(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->threads, 3);
  EXPECT_EQ(p->why, "OMP_NUM_THREADS=3");

  in.omp_num_threads = "2,1";  // OpenMP's nesting list: the outer level counts
  p = PlanThreads(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->threads, 2);

  in.flag = 6;
  p = PlanThreads(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->threads, 6);
  EXPECT_EQ(p->why, "--threads 6");
}

// Catches: a typo silently becoming 1 thread (or 0) instead of an error that names it.
TEST(PlanThreadsTest, MalformedValuesAreErrorsNamingTheirSource) {
  ThreadSources in = Host(4, "two");
  absl::Status s = PlanThreads(in).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("LOCAL_WORLD_SIZE"), absl::string_view::npos) << s;

  in = Host(4, "0");
  EXPECT_EQ(PlanThreads(in).status().code(), absl::StatusCode::kInvalidArgument);

  in = Host(4);
  in.omp_num_threads = "many";
  s = PlanThreads(in).status();
  EXPECT_NE(s.message().find("OMP_NUM_THREADS"), absl::string_view::npos) << s;

  in = Host(4);
  in.flag = -1;
  s = PlanThreads(in).status();
  EXPECT_NE(s.message().find("--threads"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace trainstep
