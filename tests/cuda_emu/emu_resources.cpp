// What each of the backend's kernels takes on an H100 (kernel_resources.py's
// table, from nvcc's PTX and ptxas -v), found by the emulated kernel's symbol:
// the program's own ELF symbol table names the function a launch's pointer is.
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "emu_internal.h"

#ifndef WICK_EMU_RESOURCES_FILE
#define WICK_EMU_RESOURCES_FILE ""
#endif

namespace wick_emu {
namespace {

constexpr const char* kBackend = "_ZN4wick4cuda";  // (the backend's kernels' namespace)

// The load address of the program itself (0 where it is not position independent).
uintptr_t program_base() {
  uintptr_t base = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        *static_cast<uintptr_t*>(out) = info->dlpi_addr;
        return 1;  // (the first object is the program)
      },
      &base);
  return base;
}

// Address -> mangled name of the program's functions in the backend's namespace.
std::unordered_map<uintptr_t, std::string> backend_functions() {
  std::unordered_map<uintptr_t, std::string> out;
  const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  struct stat st {};
  fstat(fd, &st);
  void* map = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return out;
  const auto* bytes = static_cast<const unsigned char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes);
  if (size_t(st.st_size) >= sizeof(Elf64_Ehdr) && std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
      eh->e_ident[EI_CLASS] == ELFCLASS64) {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(bytes + eh->e_shoff);
    const uintptr_t base = program_base();
    for (int i = 0; i < eh->e_shnum; ++i) {
      if (sh[i].sh_type != SHT_SYMTAB) continue;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(bytes + sh[i].sh_offset);
      const char* names = reinterpret_cast<const char*>(bytes + sh[sh[i].sh_link].sh_offset);
      for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
        const char* name = names + syms[k].st_name;
        if (ELF64_ST_TYPE(syms[k].st_info) == STT_FUNC && syms[k].st_value &&
            std::strncmp(name, kBackend, std::strlen(kBackend)) == 0)
          out.emplace(base + syms[k].st_value, name);
      }
    }
  }
  munmap(map, size_t(st.st_size));
  return out;
}

struct Table {
  std::string path;  // "" where none is used
  std::unordered_map<std::string, KernelResources> by_name;
  std::unordered_map<uintptr_t, std::string> functions;
  size_t n_matched = 0;  // lines that name one of the functions
};

const Table& table() {
  static const Table* t = [] {
    auto* t = new Table;
    const char* env = std::getenv("WICK_EMU_RESOURCES");
    t->path = env ? env : WICK_EMU_RESOURCES_FILE;
    if (t->path.empty() || t->path == "none") {
      t->path.clear();
      return t;
    }
    std::ifstream in(t->path);
    if (!in) {
      std::fprintf(stderr, "cuda emulator: no kernel resources at %s (WICK_EMU_RESOURCES)\n",
                   t->path.c_str());
      std::abort();
    }
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string name;
      KernelResources r{};
      if (fields >> name >> r.regs >> r.static_smem >> r.stack >> r.max_threads)
        t->by_name[name] = r;
    }
    t->functions = backend_functions();
    for (const auto& f : t->functions) t->n_matched += t->by_name.count(f.second);
    if (!t->by_name.empty() && t->n_matched == 0) {
      std::fprintf(stderr,
                   "cuda emulator: %s names none of this program's kernels (is it stripped?)\n",
                   t->path.c_str());
      std::abort();
    }
    return t;
  }();
  return *t;
}

std::mutex g_set_mu;
std::unordered_map<const void*, KernelResources> g_set;  // set_kernel_resources

}  // namespace

void set_kernel_resources(const void* kernel, const KernelResources& r) {
  std::lock_guard<std::mutex> lock(g_set_mu);
  g_set[kernel] = r;
}

std::pair<size_t, size_t> resource_table_lines() {
  return {table().by_name.size(), table().n_matched};
}

const KernelResources* kernel_resources(const void* kernel) {
  {
    std::lock_guard<std::mutex> lock(g_set_mu);
    auto s = g_set.find(kernel);
    if (s != g_set.end()) return &s->second;
  }
  const Table& t = table();
  if (t.path.empty()) return nullptr;
  auto f = t.functions.find(reinterpret_cast<uintptr_t>(kernel));
  if (f == t.functions.end()) return nullptr;  // not the backend's: a test's own kernel
  auto r = t.by_name.find(f->second);
  if (r == t.by_name.end()) {
    // a backend kernel nvcc did not compile as this one: the table is stale
    std::fprintf(stderr, "cuda emulator: %s is not in %s (rebuild it: kernel_resources.py)\n",
                 f->second.c_str(), t.path.c_str());
    std::abort();
  }
  return &r->second;
}

int warp_registers(const KernelResources& r) {
  return (std::max(1, r.regs) * 32 + 255) / 256 * 256;
}

int max_threads_of(const KernelResources& r) {
  int n = std::min(1024, 65536 / warp_registers(r) * 32);  // (64 K an SM and a CTA)
  if (r.max_threads > 0) n = std::min(n, r.max_threads);
  return n;
}

}  // namespace wick_emu
