// The default thread count under a container's CPU limit: cgroup v1 and v2 files laid out in a
// temporary directory as the kernel mounts them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_limit.h"

namespace fs = std::filesystem;
using wick::cpu::cgroup_cpu_limit;
using wick::cpu::default_n_threads;

namespace {

class CpuLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("wick_cgroup_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  std::string root() const { return root_.string(); }
  fs::path root_;
};

TEST_F(CpuLimit, CgroupV2QuotaOverPeriod) {
  write("cpu.max", "250000 100000");
  const auto limit = cgroup_cpu_limit("0::/\n", root());
  ASSERT_TRUE(limit);
  EXPECT_DOUBLE_EQ(*limit, 2.5);
  EXPECT_EQ(default_n_threads(64, limit), 3);
}

TEST_F(CpuLimit, CgroupV2MaxIsNoLimit) {
  write("cpu.max", "max 100000");
  EXPECT_FALSE(cgroup_cpu_limit("0::/\n", root()));
  EXPECT_EQ(default_n_threads(64, std::nullopt), 64);
}

TEST_F(CpuLimit, CgroupV2TheTightestAncestorWins) {
  // a pod limited to 4 cores, its container to 1.5, and the host slice above with none
  write("cpu.max", "max 100000");
  write("kubepods/cpu.max", "max 100000");
  write("kubepods/pod1/cpu.max", "400000 100000");
  write("kubepods/pod1/ctr/cpu.max", "150000 100000");
  auto limit = cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", root());
  ASSERT_TRUE(limit);
  EXPECT_DOUBLE_EQ(*limit, 1.5);
  EXPECT_EQ(default_n_threads(16, limit), 2);
  // the container's own limit lifted: the pod's holds
  write("kubepods/pod1/ctr/cpu.max", "max 100000");
  limit = cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", root());
  ASSERT_TRUE(limit);
  EXPECT_DOUBLE_EQ(*limit, 4.0);
}

TEST_F(CpuLimit, CgroupV1CfsQuota) {
  write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000");
  write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000");
  write("cpu,cpuacct/cpu.cfs_quota_us", "-1");
  write("cpu,cpuacct/cpu.cfs_period_us", "100000");
  const std::string proc = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n";
  const auto limit = cgroup_cpu_limit(proc, root());
  ASSERT_TRUE(limit);
  EXPECT_DOUBLE_EQ(*limit, 2.0);
  EXPECT_EQ(default_n_threads(8, limit), 2);
}

TEST_F(CpuLimit, CgroupV1InANamespaceReadsTheMountRoot) {
  // docker with its own cgroup namespace: the path is "/", the mount root is the container's
  write("cpu/cpu.cfs_quota_us", "50000");
  write("cpu/cpu.cfs_period_us", "100000");
  const auto limit = cgroup_cpu_limit("3:cpu:/\n", root());
  ASSERT_TRUE(limit);
  EXPECT_DOUBLE_EQ(*limit, 0.5);
  EXPECT_EQ(default_n_threads(8, limit), 1);  // never 0
}

TEST_F(CpuLimit, NoFilesOrGarbageMeanNoLimit) {
  EXPECT_FALSE(cgroup_cpu_limit("0::/\n", root()));
  EXPECT_FALSE(cgroup_cpu_limit("", root()));
  EXPECT_FALSE(cgroup_cpu_limit("not a cgroup line\n::\n", root()));
  write("cpu.max", "lots 100000");
  EXPECT_FALSE(cgroup_cpu_limit("0::/\n", root()));
  write("cpu.max", "200000 0");
  EXPECT_FALSE(cgroup_cpu_limit("0::/\n", root()));
  write("cpu.max", "");
  EXPECT_FALSE(cgroup_cpu_limit("0::/\n", root()));
  // a v1 line for other controllers only
  write("cpu/cpu.cfs_quota_us", "100000");
  write("cpu/cpu.cfs_period_us", "100000");
  EXPECT_FALSE(cgroup_cpu_limit("5:memory:/\n", root()));
}

TEST_F(CpuLimit, WholeQuotasAreNotRoundedUp) {
  EXPECT_EQ(default_n_threads(64, 2.0), 2);
  EXPECT_EQ(default_n_threads(64, 3.0 * 100000 / 100000), 3);
  EXPECT_EQ(default_n_threads(2, 8.0), 2);  // the limit never adds cores
  EXPECT_EQ(default_n_threads(0, std::nullopt), 1);
}

}  // namespace
