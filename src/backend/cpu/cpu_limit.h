// The CPU time a container may use. A cgroup's CPU quota (docker --cpus, a Kubernetes CPU limit)
// does not narrow the cores a process sees: a 2-CPU container on a 64-core host has 64, and 64
// worker threads there burn the quota in 1/32 of each period, then wait for the next one at every
// barrier. The default thread count follows the quota instead.
#pragma once

#include <optional>
#include <string>

namespace wick::cpu {

// The CPU limit (quota / period, in cores) of the cgroup a process is in, the smallest over the
// cgroup and its ancestors; nullopt when there is none. proc_cgroup is the text of
// /proc/self/cgroup; fs_root the cgroup file systems' mount root (/sys/fs/cgroup): cgroup v2's
// cpu.max, or v1's cpu.cfs_quota_us and cpu.cfs_period_us under cpu,cpuacct/ or cpu/.
std::optional<double> cgroup_cpu_limit(const std::string& proc_cgroup, const std::string& fs_root);

// This process's: cgroup_cpu_limit of /proc/self/cgroup and /sys/fs/cgroup (read once).
std::optional<double> process_cpu_limit();

// Worker threads by default: the cores this process may run on, at most the CPU limit rounded
// up (at least 1).
int default_n_threads(int n_procs, std::optional<double> limit);

}  // namespace wick::cpu
