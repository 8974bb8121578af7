#include "backend/cpu/cpu_limit.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

namespace wick::cpu {

namespace {

// The first line of a file ("" when it cannot be read).
std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

// A positive number, or nullopt for "max", "-1", garbage and an empty string.
std::optional<double> positive(const std::string& s) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size() && v > 0 && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// A cgroup path and its ancestors, deepest first: /a/b, /a, / (as "/a/b", "/a", "").
std::vector<std::string> with_ancestors(std::string path) {
  while (!path.empty() && path.back() == '/') path.pop_back();
  std::vector<std::string> out;
  for (;;) {
    out.push_back(path);
    const size_t slash = path.rfind('/');
    if (path.empty() || slash == std::string::npos) break;
    path.resize(slash);
  }
  return out;
}

void keep_min(std::optional<double>& m, std::optional<double> v) {
  if (v && (!m || *v < *m)) m = v;
}

// cgroup v2: "QUOTA PERIOD" or "max PERIOD".
std::optional<double> v2_limit(const std::string& dir) {
  std::istringstream in(first_line(dir + "/cpu.max"));
  std::string quota, period;
  if (!(in >> quota >> period)) return std::nullopt;
  const auto q = positive(quota), p = positive(period);
  if (!q || !p) return std::nullopt;
  return *q / *p;
}

// cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
std::optional<double> v1_limit(const std::string& dir) {
  const auto q = positive(first_line(dir + "/cpu.cfs_quota_us"));
  const auto p = positive(first_line(dir + "/cpu.cfs_period_us"));
  if (!q || !p) return std::nullopt;
  return *q / *p;
}

}  // namespace

std::optional<double> cgroup_cpu_limit(const std::string& proc_cgroup, const std::string& fs_root) {
  std::optional<double> limit;
  std::istringstream lines(proc_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // hierarchy-id:controllers:path; the path may itself hold ':'
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string hierarchy = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (hierarchy == "0" && controllers.empty()) {
      for (const auto& p : with_ancestors(path)) keep_min(limit, v2_limit(fs_root + p));
      continue;
    }
    bool has_cpu = false;
    std::istringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');) has_cpu |= c == "cpu";
    if (!has_cpu) continue;
    for (const char* mount : {"/cpu,cpuacct", "/cpuacct,cpu", "/cpu"})
      for (const auto& p : with_ancestors(path)) keep_min(limit, v1_limit(fs_root + mount + p));
  }
  return limit;
}

std::optional<double> process_cpu_limit() {
  static const std::optional<double> limit = [] {
    std::ifstream f("/proc/self/cgroup");
    std::stringstream text;
    text << f.rdbuf();
    return cgroup_cpu_limit(text.str(), "/sys/fs/cgroup");
  }();
  return limit;
}

int default_n_threads(int n_procs, std::optional<double> limit) {
  int n = std::max(n_procs, 1);
  // 1e-9: a quota of exactly 2 periods is 2 cores, whatever the division's rounding
  if (limit) n = std::min(n, std::max(1, int(std::ceil(*limit - 1e-9))));
  return n;
}

}  // namespace wick::cpu
