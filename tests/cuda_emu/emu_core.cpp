// The emulator's threads: a CTA's threads as fibers on one host thread,
// switched only where CUDA threads meet (barriers, warp collectives), so a
// run is deterministic and a barrier some threads never reach is reported,
// not hung.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "emu_internal.h"

// Saves the callee-saved registers on this stack, stores its pointer in
// *from, and resumes the stack `to` (x86-64 System V; ucontext's switch
// makes two system calls, this one none: a warp's shuffle is 64 switches).
extern "C" void wick_emu_switch(void** from, void* to);
asm(R"(
.text
.globl wick_emu_switch
.type wick_emu_switch,@function
wick_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size wick_emu_switch,.-wick_emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");

namespace wick_emu {

namespace {

// The race check (make test-emu-race, WICK_EMU_TSAN): the kernels under
// ThreadSanitizer, each CUDA thread a TSan fiber. Switches between them carry
// no ordering; what orders a CTA's threads is what orders them on a GPU:
// __syncthreads and __syncwarp (the CUDA guide: shuffles, votes, mma and
// ldmatrix wait for their lanes but order no memory), and what orders CTAs is
// a __threadfence before an atomic in one and one after it in another (fence).
// CTAs run in waves (WICK_EMU_RACE_CTAS of them, 1 by default): a wave's CTAs
// are ordered with the host at its start and end and not with each other, so
// races between them are looked for. This file is not instrumented: its reads
// and writes for the threads (ldmatrix's rows, cp.async's copies) are told to
// TSan in the thread that makes them.
//
// TSan (v3) keeps 256 slots, a thread's identity; beyond them it hands a slot
// from one thread to another and misses races between the two. So a wave has
// at most kIdentities: one for each CUDA thread while they fit, else one for
// each warp (races between a warp's lanes are then not looked for), else one
// for each CTA (only races between CTAs are).
namespace race {
constexpr size_t kIdentities = 224;
#ifdef WICK_EMU_TSAN
extern "C" {
void* __tsan_get_current_fiber();
void* __tsan_create_fiber(unsigned flags);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, const char* name);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void __tsan_read_range(void* addr, unsigned long size);
void __tsan_read_range_pc(void* addr, unsigned long size, void* pc);
void __tsan_read1_pc(void* addr, void* pc);
void __tsan_read2_pc(void* addr, void* pc);
void __tsan_read4_pc(void* addr, void* pc);
void __tsan_read8_pc(void* addr, void* pc);
void __tsan_read16_pc(void* addr, void* pc);
void __tsan_write_range(void* addr, unsigned long size);
}
constexpr bool kOn = true;
inline void* current() {
  return __tsan_get_current_fiber();
}
inline void to(void* fiber) {
  __tsan_switch_to_fiber(fiber, 1u);  // __tsan_switch_to_fiber_no_sync
}
inline void release(const void* a) {
  __tsan_release(const_cast<void*>(a));
}
inline void acquire(const void* a) {
  __tsan_acquire(const_cast<void*>(a));
}
inline void read(const void* p, size_t n) {
  __tsan_read_range(const_cast<void*>(p), n);
}
inline void write(void* p, size_t n) {
  __tsan_write_range(p, n);
}
inline void read_at(const void* p, size_t n, void* pc) {
  void* const a = const_cast<void*>(p);
  switch (n) {  // (a report of a range's read says 1 byte)
    case 1:
      return __tsan_read1_pc(a, pc);
    case 2:
      return __tsan_read2_pc(a, pc);
    case 4:
      return __tsan_read4_pc(a, pc);
    case 8:
      return __tsan_read8_pc(a, pc);
    case 16:
      return __tsan_read16_pc(a, pc);
    default:
      return __tsan_read_range_pc(a, n, pc);
  }
}
// Identity k of a wave, made once a host thread and kept (a wave's start
// orders it after all it did before).
void* fiber(size_t k) {
  thread_local std::vector<void*> pool;
  while (pool.size() <= k) {
    pool.push_back(__tsan_create_fiber(0));
    __tsan_set_fiber_name(pool.back(),
                          ("cuda identity " + std::to_string(pool.size() - 1)).c_str());
  }
  return pool[k];
}
// The read-only path's identity (nc_read), one a host thread.
void* nc_fiber() {
  thread_local void* f = [] {
    void* n = __tsan_create_fiber(0);
    __tsan_set_fiber_name(n, "cuda read-only path");
    return n;
  }();
  return f;
}
#else
constexpr bool kOn = false;
inline void* current() {
  return nullptr;
}
inline void to(void*) {}
inline void release(const void*) {}
inline void acquire(const void*) {}
inline void read(const void*, size_t) {}
inline void write(void*, size_t) {}
inline void read_at(const void*, size_t, void*) {}
inline void* fiber(size_t) {
  return nullptr;
}
inline void* nc_fiber() {
  return nullptr;
}
#endif

// A grid's loads through the read-only path are its identity's, ordered after
// what the host did before the launch and before what it does after, and with
// nothing in the launch: each a report if a thread of the launch writes the
// same bytes, before it or after.
class NcOrder {
 public:
  NcOrder() {
    release(&start_);
    void* const host = current();
    to(nc_fiber());
    acquire(&start_);
    to(host);
  }
  ~NcOrder() {  // (an error's too: the next launch's writes follow these reads)
    void* const host = current();
    to(nc_fiber());
    release(&end_);
    to(host);
    acquire(&end_);
  }
  NcOrder(const NcOrder&) = delete;
  NcOrder& operator=(const NcOrder&) = delete;

 private:
  char start_ = 0, end_ = 0;
};

// CTAs a wave (1 outside the race check).
int g_ctas_per_wave = [] {
  const char* v = std::getenv("WICK_EMU_RACE_CTAS");
  return v && *v ? std::max(1, std::atoi(v)) : 1;
}();

// How a wave of n_ctas CTAs of n_threads maps CUDA threads to identities:
// thread i of the wave's CTA s is identity s * per_cta + i / per_unit.
struct Units {
  size_t per_cta, per_unit;
};
Units units(size_t n_ctas, size_t n_threads) {
  if (n_ctas * n_threads <= kIdentities) return {n_threads, 1};
  const size_t n_warps = (n_threads + 31) / 32;
  if (n_ctas * n_warps <= kIdentities) return {n_warps, 32};
  return {1, n_threads};
}
}  // namespace race

enum class St { Run, Barrier, Warp, Done };
enum class Op { None, Sync, Shfl, Vote, Mma, Imma, Ldsm };

struct Copy {
  void* dst;
  const void* src;
  int size, bytes;
};

struct Fiber {
  void* sp = nullptr;  // its stack, while it is not running
  uint3 tid{};
  int lane = 0;
  St st = St::Run;
  // the warp collective this thread waits in, its inputs and results
  Op op = Op::None;
  unsigned mask = 0;
  int kind = 0, arg = 0, width = 32;
  uint64_t in = 0, out = 0;
  uint32_t a[4]{}, b[2]{};
  int k = 0;
  bool flag = false;
  float c[4]{};
  int ci[4]{};
  const void* addr = nullptr;
  // cp.async: copies not yet done, grouped (group_end[i]: copies of groups <= i)
  std::vector<Copy> copies;
  std::vector<size_t> group_end;
  // the race check: its TSan fiber; the barrier it waits at; its __syncwarp
  // count, a release slot for each parity of it, and the parities of the
  // lanes it last synced with (lane m released into slot m's parity); whether
  // it has passed a __threadfence (its atomics release from then on)
  void* race_fiber = nullptr;
  unsigned bar_gen = 0, n_warp_syncs = 0, peer_parity = 0;
  char warp_slot[2]{};
  bool fenced = false;
};

// The race check's order of a wave's CTAs with the host: each one's threads
// acquire `start` (the CTAs' set-up) and release into `end` as they finish.
struct Wave {
  char start = 0, end = 0;
};

constexpr size_t kStaticSmem = 48 * 1024;  // CUDA's bound on a kernel's __shared__ variables

struct CtaRun {
  std::vector<Fiber> fibers;
  // bit i: fibers[i] can run (St::Run), kept by set_st; the schedulers scan
  // these words, not the fibers (a shuffled schedule's random start scanned
  // past parked fibers' cache lines: the shuffled kernel run 108.7 -> 66.4 s)
  std::vector<uint64_t> runnable;
  std::vector<unsigned> waiting;  // a warp's lanes parked in a collective
  void* sched_sp = nullptr;       // the scheduler's stack, while a thread runs
  uint3 bid{};
  dim3 bdim, gdim;
  std::vector<unsigned char> smem_store;
  unsigned char* smem = nullptr;  // 128-byte aligned, in smem_store
  size_t smem_bytes = 0, smem_limit = 0;
  // the __shared__ variables (static_smem): their keys and offsets, in order
  std::vector<unsigned char> static_store;
  unsigned char* statics = nullptr;  // 128-byte aligned, in static_store
  struct StaticVar {
    const void* key;
    size_t offset;
  };
  StaticVar static_vars[64]{};  // (fixed: a vector's growth would be a thread's memmove)
  size_t n_static_vars = 0, n_static_bytes = 0;
  const Body* body = nullptr;
  std::string error;  // what a thread found wrong (it stopped there)
  // the race check: the host's TSan fiber; the wave; the barriers passed, and
  // a release object for each parity of that count (a thread's next release
  // into one waits until all have left the last); the global addresses of
  // the CTA's atomics so far (a __threadfence acquires them)
  void* host_fiber = nullptr;
  Wave* wave = nullptr;
  unsigned n_barriers = 0;
  char bar_sync[2]{};
  const void* atomics[64]{};
  size_t n_atomics = 0;
  bool ended = false;  // end_all has run
};

namespace race {
// A CTA stopped by an error: its threads that did not finish end here (each
// releases as it would have at its end), so that the host may free what they
// used.
void end_all(CtaRun& c) {
  if (c.ended) return;
  c.ended = true;
  for (Fiber& f : c.fibers)
    if (f.st != St::Done) {
      to(f.race_fiber);
      release(&c.wave->end);
    }
  to(c.host_fiber);
  acquire(&c.wave->end);
}
}  // namespace race

thread_local CtaRun* g_cta = nullptr;
thread_local Fiber* g_cur = nullptr;

constexpr size_t kStack = 64 * 1024;  // the kernels' locals are registers: a few KB
constexpr size_t kRedZone = 64;
// Fresh dynamic shared memory: 0xff bytes read as NaN floats, so that a value
// read before it is written shows (WICK_EMU_POISON=0 gives zeros).
unsigned char poison() {
  static const unsigned char p = [] {
    const char* v = std::getenv("WICK_EMU_POISON");
    return v && *v ? (unsigned char)std::strtol(v, nullptr, 0) : (unsigned char)0xff;
  }();
  return p;
}

// Under ASan (the kernels instrumented, this file not): threads stopped by a
// reported error leave their frames' red zones poisoned on their stacks,
// which the next CTA's threads would trip on; run_cta clears them.
extern "C" void __asan_unpoison_memory_region(void const volatile*, size_t) __attribute__((weak));

// Threads' stacks, mapped once a host thread (untouched pages cost nothing).
// A wave's threads each have their own: under the race check a stack shared
// by two CTAs' threads would be reported as their race.
constexpr size_t kStacks = race::kOn ? 16 * 1024 : 1024;
struct Stacks {
  char* s = [] {
    void* p = mmap(nullptr, kStacks * kStack, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda emulator: no memory for threads' stacks");
    return static_cast<char*>(p);
  }();
  ~Stacks() { munmap(s, kStacks * kStack); }
  char* get(size_t i) { return s + i * kStack; }
};
thread_local Stacks g_stacks;

[[noreturn]] void die(const std::string& what) {
  throw std::runtime_error("cuda emulator: " + what);
}

// Shuffled schedules (WICK_EMU_SHUFFLE=seed, 0 off): a GPU runs a grid's
// CTAs, and a CTA's warps between barriers, in no fixed order, so what a
// kernel computes must not depend on it (atomics' order, which CTA is last).
// With a seed, CTAs run in a random order and the thread to run after one
// that parks is a random runnable one, the same for the same seed.
uint64_t g_shuffle = [] {
  const char* v = std::getenv("WICK_EMU_SHUFFLE");
  return v && *v ? std::strtoull(v, nullptr, 0) : 0ull;
}();
thread_local uint64_t g_shuffle_state = g_shuffle * 0x2545f4914f6cdd1dull;
inline size_t shuffled(size_t n) {  // a number below n (splitmix64's steps)
  uint64_t z = (g_shuffle_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return size_t((z ^ (z >> 31)) % n);
}

// A thread's state, and its bit in c.runnable.
inline void set_st(CtaRun& c, Fiber& f, St st) {
  const size_t i = size_t(&f - c.fibers.data());
  const uint64_t bit = uint64_t(1) << (i % 64);
  f.st = st;
  if (st == St::Run)
    c.runnable[i / 64] |= bit;
  else
    c.runnable[i / 64] &= ~bit;
}

// The first runnable thread at index `from` or after, round the CTA; n when
// none can run.
inline size_t next_runnable(const CtaRun& c, size_t from) {
  const size_t n_words = c.runnable.size();
  size_t w = from / 64;
  uint64_t bits = c.runnable[w] & (~uint64_t(0) << (from % 64));
  for (size_t k = 0; k <= n_words; ++k) {  // (the last: from's word again, below from)
    if (bits) return w * 64 + size_t(__builtin_ctzll(bits));
    w = w + 1 == n_words ? 0 : w + 1;
    bits = c.runnable[w];
  }
  return c.fibers.size();
}

// The thread to run after f: the next runnable one in index order round the
// CTA (from a random one when shuffled; f itself when it is the only one);
// null when none can run or a thread found an error, and the scheduler must
// decide.
inline Fiber* next_after(CtaRun& c, Fiber* f) {
  if (!c.error.empty()) return nullptr;
  const size_t n = c.fibers.size();
  const size_t i = g_shuffle ? shuffled(n) : size_t(f - c.fibers.data());
  const size_t j = next_runnable(c, i + 1 < n ? i + 1 : 0);
  return j < n ? &c.fibers[j] : nullptr;
}

// Runs the next thread from the running one, which has just parked (or not):
// a direct switch, one instead of two through the scheduler. (Inlined into
// the collectives: after a switch each return to a caller mispredicts, the
// return stack being another thread's.)
[[gnu::always_inline]] inline void switch_on() {
  Fiber* f = g_cur;
  Fiber* next = next_after(*g_cta, f);
  if (next == f) return;
  if (!next) {
    race::to(g_cta->host_fiber);
    wick_emu_switch(&f->sp, g_cta->sched_sp);
    return;
  }
  g_cur = next;
  if (next->race_fiber != f->race_fiber) race::to(next->race_fiber);
  wick_emu_switch(&f->sp, next->sp);
}

void park(St st) {
  set_st(*g_cta, *g_cur, st);
  switch_on();
}

[[noreturn]] void fiber_main() {
  race::acquire(&g_cta->wave->start);
  g_cta->body->operator()();
  race::release(&g_cta->wave->end);
  park(St::Done);
  std::abort();  // a finished thread is never resumed
}

// A fresh thread's stack: fiber_main as the return address of the switch,
// below it the six registers the switch pops (zeros).
void* fresh_stack(char* base) {
  auto top = (reinterpret_cast<uintptr_t>(base) + kStack) & ~uintptr_t(15);
  auto* p = reinterpret_cast<void**>(top - 16);
  p[1] = nullptr;  // fiber_main's return address: it never returns
  p[0] = reinterpret_cast<void*>(&fiber_main);
  p -= 6;
  for (int i = 0; i < 6; ++i) p[i] = nullptr;
  return p;
}

// f16 to float for every bit pattern, built once (the host's __half2float is
// a loop of bit operations; an mma converts 384 of them).
const float* f16_values() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t v = 0; v < 65536; ++v) t[v] = __half2float(bits_to<__half>(v));
    return t;
  }();
  return table.data();
}

// m16n8k16 of 16-bit floats (A row-major 16 x 16, B col-major 16 x 8, in
// pairs; lane l holds rows g = l / 4 (+8), columns 2t, 2t + 1 (+8), t = l % 4):
// each lane's D = its C + the exact products summed in double (k in order),
// rounded once. (Compiled for AVX-512 and AVX2 too: a prefill's full tiles
// spend most of an mma's time in the 2,048 products; no contraction to FMA in
// any of them: -ffp-contract=off.)
[[gnu::target_clones("avx512f", "avx2", "default")]] void resolve_mma(Fiber* const lanes[32]) {
  const bool bf16 = lanes[0]->flag;
  uint16_t A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const Fiber& s = *lanes[l];
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = uint16_t(s.a[0] >> (16 * h));
      A[g + 8][2 * t + h] = uint16_t(s.a[1] >> (16 * h));
      A[g][2 * t + 8 + h] = uint16_t(s.a[2] >> (16 * h));
      A[g + 8][2 * t + 8 + h] = uint16_t(s.a[3] >> (16 * h));
      B[2 * t + h][g] = uint16_t(s.b[0] >> (16 * h));
      B[2 * t + 8 + h][g] = uint16_t(s.b[1] >> (16 * h));
    }
  }
  const float* f16 = f16_values();
  auto value = [&](uint16_t v) {  // bf16: f32's upper half
    return double(bf16 ? bits_to<float>(uint32_t(v) << 16) : f16[v]);
  };
  const uint16_t exp_ones = bf16 ? 0x7f80 : 0x7c00;  // inf, NaN
  bool b_finite = true;
  double Bd[16][8];
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      b_finite &= (B[k][n] & exp_ones) != exp_ones;
      Bd[k][n] = value(B[k][n]);
    }
  // (row by row over k, the 8 columns side by side: each sum still adds its
  // products in k's order, so its bits are those of one sum at a time). A
  // row of zeros (a decode step's rows past its tokens: 15 of 16) sums to +0
  // when B is finite, as S starts: it is skipped.
  double S[16][8] = {};
  for (int r = 0; r < 16; ++r) {
    bool zeros = b_finite;
    for (int k = 0; k < 16; ++k) zeros &= (A[r][k] & 0x7fff) == 0;
    if (zeros) continue;
    for (int k = 0; k < 16; ++k) {
      const double a = value(A[r][k]);
      for (int n = 0; n < 8; ++n) S[r][n] += a * Bd[k][n];
    }
  }
  for (int l = 0; l < 32; ++l) {
    Fiber& f = *lanes[l];
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i)
      f.c[i] = float(double(f.c[i]) + S[g + 8 * (i >= 2)][2 * t + (i & 1)]);
  }
}

// m16n8k32 (4 A words, 2 B words a lane) or m16n8k16 (2, 1) of 8-bit
// integers: lane l holds A's row g (+8) at columns 4t.. (+16) and B's column g
// at rows 4t.. (+16); s32 sums from zero. (B's rows as 8 ints side by side, and
// compiled for AVX2 and AVX-512: the baseline has no 32-bit vector multiply.)
[[gnu::target_clones("avx512f", "avx2", "default")]] void resolve_imma(Fiber* const lanes[32]) {
  using I8 = int __attribute__((vector_size(32)));
  const int K = lanes[0]->k;
  const bool b_u8 = lanes[0]->flag;
  int A[16][32] = {};
  I8 B[32] = {};
  for (int l = 0; l < 32; ++l) {
    const Fiber& s = *lanes[l];
    const int g = l / 4, t = l % 4;
    for (int j = 0; j < 4; ++j) {
      A[g][4 * t + j] = int8_t(s.a[0] >> (8 * j));
      A[g + 8][4 * t + j] = int8_t(s.a[1] >> (8 * j));
      const uint32_t b0 = (s.b[0] >> (8 * j)) & 0xff;
      B[4 * t + j][g] = b_u8 ? int(b0) : int(int8_t(b0));
      if (K == 32) {
        A[g][4 * t + 16 + j] = int8_t(s.a[2] >> (8 * j));
        A[g + 8][4 * t + 16 + j] = int8_t(s.a[3] >> (8 * j));
        const uint32_t b1 = (s.b[1] >> (8 * j)) & 0xff;
        B[4 * t + 16 + j][g] = b_u8 ? int(b1) : int(int8_t(b1));
      }
    }
  }
  I8 S[16] = {};
  for (int r = 0; r < 16; ++r) {
    bool zeros = true;  // (a decode step's rows past its tokens)
    for (int k = 0; k < K; ++k) zeros &= A[r][k] == 0;
    if (zeros) continue;
    I8 sum = {};
    for (int k = 0; k < K; ++k) sum += A[r][k] * B[k];
    S[r] = sum;
  }
  for (int l = 0; l < 32; ++l) {
    Fiber& f = *lanes[l];
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) f.ci[i] = S[g + 8 * (i >= 2)][2 * t + (i & 1)];
  }
}

// The lanes of `group` are all in the same collective: computes each one's
// result and lets them run. Returns what was wrong, if anything (it runs in a
// thread, which must not throw).
std::string resolve(Fiber* const lanes[32], unsigned group, Op op) {
  if (op == Op::Mma) resolve_mma(lanes);
  if (op == Op::Imma) resolve_imma(lanes);
  for (int l = 0; l < 32; ++l) {
    if (!(group >> l & 1u)) continue;
    Fiber* f = lanes[l];
    switch (op) {
      case Op::Shfl: {
        const int w = f->width, base = l & ~(w - 1);
        int src = l;
        if (f->kind == 0) src = base + (f->arg & (w - 1));
        if (f->kind == 1) src = l - f->arg >= base ? l - f->arg : l;
        if (f->kind == 2) src = l + f->arg < base + w ? l + f->arg : l;
        if (f->kind == 3) src = (l ^ f->arg) < base + w ? l ^ f->arg : l;
        if (!(group >> src & 1u)) return "a shuffle reads a lane outside its mask";
        f->out = lanes[src]->in;
        break;
      }
      case Op::Vote: {
        unsigned ballot = 0;
        for (int j = 0; j < 32; ++j)
          if (group >> j & 1u && lanes[j]->flag) ballot |= 1u << j;
        f->out = f->kind == 0 ? ballot != 0 : f->kind == 1 ? ballot == group : ballot;
        break;
      }
      case Op::Ldsm: {
        // x2: lanes 0-7 address matrix 0's rows, 8-15 matrix 1's (8 x 16-bit
        // each). Lane l gets row l / 4, columns 2 (l % 4) and +1 of each
        // matrix, or with .trans rows 2 (l % 4) and +1 of column l / 4.
        uint32_t r[2];
        for (int m = 0; m < 2; ++m) {
          uint16_t h[2];
          for (int j = 0; j < 2; ++j) {
            const int row = f->flag ? 2 * (l % 4) + j : l / 4;
            const int col = f->flag ? l / 4 : 2 * (l % 4) + j;
            const auto* p = static_cast<const unsigned char*>(lanes[8 * m + row]->addr);
            std::memcpy(&h[j], p + 2 * col, 2);
          }
          r[m] = uint32_t(h[0]) | uint32_t(h[1]) << 16;
        }
        f->out = uint64_t(r[0]) | uint64_t(r[1]) << 32;
        break;
      }
      default:
        break;
    }
  }
  for (int l = 0; l < 32; ++l)
    if (group >> l & 1u) set_st(*g_cta, *lanes[l], St::Run), lanes[l]->op = Op::None;
  return {};
}

[[noreturn]] void fiber_fail(const std::string& what);

// Lane f, the last of its mask to arrive in a collective: when every lane
// there waits in the same one (the same op and mask: lanes of other masks
// complete theirs apart), it completes now.
[[gnu::noinline]] void complete(Fiber& f, unsigned& waiting, size_t first) {
  CtaRun& c = *g_cta;
  Fiber* lanes[32] = {};
  for (int l = 0; l < 32; ++l) {
    if (!(f.mask >> l & 1u)) continue;
    Fiber& o = c.fibers[first + size_t(l)];        // (waiting: it exists)
    if (o.op != f.op || o.mask != f.mask) return;  // another collective: later
    lanes[l] = &o;
  }
  waiting &= ~f.mask;
  if (f.op == Op::Sync) {  // the race check: the slot each lane released into
    unsigned parity = 0;
    for (int l = 0; l < 32; ++l)
      if (lanes[l]) parity |= (lanes[l]->n_warp_syncs & 1u) << l;
    for (int l = 0; l < 32; ++l)
      if (lanes[l]) lanes[l]->peer_parity = parity;
  }
  const std::string err = resolve(lanes, f.mask, f.op);
  if (!err.empty()) fiber_fail(err);
}

// Why no thread can run: a collective waits for an exited lane, or a deadlock.
std::string why_stuck(const CtaRun& c) {
  const size_t n = c.fibers.size();
  for (size_t first = 0; first < n; first += 32) {
    unsigned live = 0;
    for (size_t l = 0; l < 32 && first + l < n; ++l)
      if (c.fibers[first + l].st != St::Done) live |= 1u << l;
    for (size_t l = 0; l < 32 && first + l < n; ++l) {
      const Fiber& f = c.fibers[first + l];
      if (f.st == St::Warp && (f.mask & ~live) != 0)
        return "a warp collective's mask names a lane that has exited";
    }
  }
  int n_bar = 0, n_warp = 0, n_done = 0;
  for (const Fiber& f : c.fibers)
    (f.st == St::Barrier ? n_bar : f.st == St::Warp ? n_warp : n_done) += 1;
  return "deadlock in a CTA: " + std::to_string(n_bar) + " threads at __syncthreads, " +
         std::to_string(n_warp) + " in a warp collective, " + std::to_string(n_done) + " exited";
}
void finish_copies(Fiber& f, size_t n_groups_done) {
  const size_t n = n_groups_done == 0 ? 0 : f.group_end[n_groups_done - 1];
  for (size_t i = 0; i < n; ++i) {
    const Copy& c = f.copies[i];
    race::read(c.src, size_t(c.bytes));
    race::write(c.dst, size_t(c.size));
    std::memcpy(c.dst, c.src, size_t(c.bytes));
    std::memset(static_cast<char*>(c.dst) + c.bytes, 0, size_t(c.size - c.bytes));
  }
  f.copies.erase(f.copies.begin(), f.copies.begin() + std::ptrdiff_t(n));
  f.group_end.erase(f.group_end.begin(), f.group_end.begin() + std::ptrdiff_t(n_groups_done));
  for (size_t& e : f.group_end) e -= n;
}

}  // namespace

const uint3& thread_idx() {
  return g_cur->tid;
}
const uint3& block_idx() {
  return g_cta->bid;
}
const dim3& block_dim() {
  return g_cta->bdim;
}
const dim3& grid_dim() {
  return g_cta->gdim;
}
unsigned char* dynamic_smem() {
  return g_cta->smem;
}

void syncthreads() {
  Fiber& f = *g_cur;
  f.bar_gen = g_cta->n_barriers;
  race::release(&g_cta->bar_sync[f.bar_gen & 1]);
  park(St::Barrier);
  race::acquire(&g_cta->bar_sync[f.bar_gen & 1]);
}

namespace {
// In a thread: stops it and leaves the error for the scheduler to throw.
[[noreturn]] void fiber_fail(const std::string& what) {
  g_cta->error = what;
  race::release(&g_cta->wave->end);  // (as at its end: the host reads the error)
  park(St::Done);
  std::abort();  // never resumed
}

Fiber& enter(Op op, unsigned mask) {
  Fiber& f = *g_cur;
  if (!(mask >> f.lane & 1u)) fiber_fail("a warp collective's mask leaves out the calling lane");
  f.op = op;
  f.mask = mask;
  return f;
}

// Waits in the collective just entered (enter): completes it when this lane
// is the last one in, then the next thread runs.
[[gnu::always_inline]] inline void wait_in_warp() {
  Fiber& f = *g_cur;
  CtaRun& c = *g_cta;
  set_st(c, f, St::Warp);
  const size_t first = size_t(&f - c.fibers.data()) & ~size_t(31);
  unsigned& waiting = c.waiting[first / 32];
  waiting |= 1u << f.lane;
  if ((waiting & f.mask) == f.mask) complete(f, waiting, first);
  switch_on();
}
}  // namespace

void syncwarp(unsigned mask) {
  Fiber& f = enter(Op::Sync, mask);
  race::release(&f.warp_slot[f.n_warp_syncs & 1]);
  wait_in_warp();
  const Fiber* lane0 = &f - f.lane;
  for (int m = 0; m < 32; ++m)
    if (mask >> m & 1u)
      race::acquire(const_cast<char*>(&lane0[m].warp_slot[f.peer_parity >> m & 1u]));
  ++f.n_warp_syncs;
}

uint64_t shfl(unsigned mask, uint64_t v, int kind, int arg, int width) {
  Fiber& f = enter(Op::Shfl, mask);
  f.in = v, f.kind = kind, f.arg = arg, f.width = width;
  wait_in_warp();
  return f.out;
}

unsigned vote(unsigned mask, bool v, int kind) {
  Fiber& f = enter(Op::Vote, mask);
  f.flag = v, f.kind = kind;
  wait_in_warp();
  return unsigned(f.out);
}

void mma_f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  Fiber& f = enter(Op::Mma, ~0u);
  std::memcpy(f.a, a, 16);
  std::memcpy(f.b, b, 8);
  std::memcpy(f.c, d, 16);
  f.flag = bf16;
  wait_in_warp();
  std::memcpy(d, f.c, 16);
}

void imma(int (&d)[4], const uint32_t* a, int n_a, const uint32_t* b, int n_b, int k, bool b_u8) {
  Fiber& f = enter(Op::Imma, ~0u);
  std::memset(f.a, 0, 16);
  std::memset(f.b, 0, 8);
  std::memcpy(f.a, a, size_t(n_a) * 4);
  std::memcpy(f.b, b, size_t(n_b) * 4);
  f.k = k, f.flag = b_u8;
  wait_in_warp();
  std::memcpy(d, f.ci, 16);
}

void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* row_addr, bool trans) {
  if (g_cur->lane < 16 && reinterpret_cast<uintptr_t>(row_addr) % 16 != 0)
    fiber_fail("ldmatrix: a row's address not aligned to 16 bytes (the PTX ISA requires it)");
  Fiber& f = enter(Op::Ldsm, ~0u);
  f.addr = row_addr, f.flag = trans;
  if (f.lane < 16) race::read(row_addr, 16);  // (its row, read by the last lane in)
  wait_in_warp();
  r0 = uint32_t(f.out), r1 = uint32_t(f.out >> 32);
}

void cp_async(void* smem, const void* gmem, int size, int bytes) {
  if (reinterpret_cast<uintptr_t>(smem) % unsigned(size) != 0 ||
      reinterpret_cast<uintptr_t>(gmem) % unsigned(size) != 0)
    fiber_fail("cp.async of " + std::to_string(size) +
               " bytes: an address not aligned to that size (the PTX ISA requires it)");
  g_cur->copies.push_back({smem, gmem, size, bytes});
}
void cp_async_commit() {
  Fiber& f = *g_cur;
  f.group_end.push_back(f.copies.size());
}
void cp_async_wait(int n_newest_pending) {
  Fiber& f = *g_cur;
  if (n_newest_pending < 0) {  // wait_all: every copy, committed or not
    cp_async_commit();
    n_newest_pending = 0;
  }
  const size_t n = f.group_end.size();
  if (n > size_t(n_newest_pending)) finish_copies(f, n - size_t(n_newest_pending));
}

namespace {
// Sets up CTA `bid` of a wave, its threads on stacks first..first + n - 1 and
// identities from identity0.
void set_up(CtaRun& c, const Body& body, uint3 bid, dim3 grid, dim3 block, size_t smem_bytes,
            size_t smem_limit, size_t first_stack, size_t identity0, race::Units u) {
  c.bid = bid, c.gdim = grid, c.bdim = block, c.body = &body;
  c.smem_bytes = smem_bytes, c.smem_limit = smem_limit;
  // n poisoned bytes, 128-byte aligned, in `store`
  auto fresh = [](std::vector<unsigned char>& store, size_t n) {
    store.assign(n + 128, poison());
    return store.data() + (-reinterpret_cast<uintptr_t>(store.data()) & 127);
  };
  c.smem = fresh(c.smem_store, smem_bytes + kRedZone);
  c.statics = fresh(c.static_store, kStaticSmem);
  const size_t n = size_t(block.x) * block.y * block.z;
  c.fibers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = c.fibers[i];
    f.tid = {unsigned(i % block.x), unsigned(i / block.x % block.y),
             unsigned(i / (size_t(block.x) * block.y))};
    f.lane = int(i % 32);
    f.sp = fresh_stack(g_stacks.get(first_stack + i));
    f.race_fiber = race::fiber(identity0 + i / u.per_unit);
  }
  c.waiting.assign((n + 31) / 32, 0u);
  c.runnable.assign((n + 63) / 64, ~uint64_t(0));  // (every thread: St::Run)
  if (n % 64) c.runnable.back() = (uint64_t(1) << (n % 64)) - 1;
  c.host_fiber = race::current();
}

// Runs a CTA set up by set_up to its end (its threads switch to each other;
// here when none can run).
void run_cta(CtaRun& c) {
  for (;;) {
    const size_t n = c.fibers.size(), j = next_runnable(c, g_shuffle ? shuffled(n) : 0);
    Fiber* first = j < n ? &c.fibers[j] : nullptr;
    if (first) {
      g_cur = first;
      race::to(first->race_fiber);
      wick_emu_switch(&c.sched_sp, first->sp);
      if (!c.error.empty()) {
        race::end_all(c);  // (before the host reads what the threads wrote)
        die(c.error);
      }
      continue;
    }
    bool all_done = true, all_barrier = true;
    for (const Fiber& f : c.fibers) {
      all_done &= f.st == St::Done;
      all_barrier &= f.st == St::Done || f.st == St::Barrier;
    }
    if (all_done) break;
    if (!all_barrier) die(why_stuck(c));
    for (Fiber& f : c.fibers)
      if (f.st == St::Barrier) set_st(c, f, St::Run);
    ++c.n_barriers;
  }
}

// CTAs first..first + n_ctas - 1 of the grid (x fastest), set up before the
// first runs and checked after the last ends (the race check orders a wave
// with the host, not its CTAs with each other).
void run_wave(const Body& body, size_t first, size_t n_ctas, dim3 grid, dim3 block,
              size_t smem_bytes, size_t smem_limit) {
  const size_t n = size_t(block.x) * block.y * block.z;
  const race::Units u = race::units(n_ctas, n);
  std::vector<std::unique_ptr<CtaRun>> ctas(n_ctas);
  for (size_t k = 0; k < n_ctas; ++k) {
    const size_t i = first + k;
    const uint3 bid{unsigned(i % grid.x), unsigned(i / grid.x % grid.y),
                    unsigned(i / (size_t(grid.x) * grid.y))};
    ctas[k] = std::make_unique<CtaRun>();
    set_up(*ctas[k], body, bid, grid, block, smem_bytes, smem_limit, k * n, k * u.per_cta, u);
  }
  Wave wave;
  for (auto& c : ctas) c->wave = &wave;
  struct Restore {
    CtaRun* cta = g_cta;
    Fiber* cur = g_cur;
    size_t n_stacks;
    bool done = false;
    ~Restore() {
      if (!done) race::end_all(*g_cta);  // (before g_cta is restored)
      g_cta = cta, g_cur = cur;
      if (!done && __asan_unpoison_memory_region)  // threads left mid-call by an error
        for (size_t i = 0; i < n_stacks; ++i)
          __asan_unpoison_memory_region(g_stacks.get(i), kStack);
    }
  } restore{g_cta, g_cur, n_ctas * n};
  race::release(&wave.start);  // (the CTAs' set-up, their shared memory's poison)
  if (g_shuffle)               // (a wave's CTAs in a random order)
    for (size_t i = n_ctas; i > 1; --i) std::swap(ctas[i - 1], ctas[shuffled(i)]);
  for (auto& c : ctas) {
    g_cta = c.get();
    run_cta(*c);
  }
  restore.done = true;
  race::acquire(&wave.end);
  for (auto& c : ctas) {
    for (Fiber& f : c->fibers)
      if (!f.copies.empty()) {  // copies never waited for: the GPU may still do them; so do we
        f.group_end.push_back(f.copies.size());
        finish_copies(f, f.group_end.size());
      }
    for (size_t i = 0; i < kRedZone; ++i)
      if (c->smem[smem_bytes + i] != poison())
        die("a kernel wrote past its " + std::to_string(smem_bytes) +
            " bytes of dynamic shared memory");
  }
}
}  // namespace

void* static_smem(const void* key, size_t size, size_t align) {
  CtaRun& c = *g_cta;
  for (size_t i = 0; i < c.n_static_vars; ++i)
    if (c.static_vars[i].key == key) return c.statics + c.static_vars[i].offset;
  const size_t offset = (c.n_static_bytes + align - 1) / align * align;
  if (offset + size > kStaticSmem)
    fiber_fail("a kernel's __shared__ variables take more than CUDA's " +
               std::to_string(kStaticSmem) + " bytes");
  if (offset + size + c.smem_bytes > c.smem_limit)
    fiber_fail("a kernel's " + std::to_string(offset + size) +
               " bytes of __shared__ variables and " + std::to_string(c.smem_bytes) +
               " of dynamic shared memory exceed the device's " + std::to_string(c.smem_limit));
  if (c.n_static_vars == std::size(c.static_vars))
    fiber_fail("a kernel with more __shared__ declarations than the emulator keeps");
  c.static_vars[c.n_static_vars++] = {key, offset};
  c.n_static_bytes = offset + size;
  return c.statics + offset;
}

// The race check's model of the PTX memory model's fences between CTAs: an
// atomic after a __threadfence in its thread releases (all the thread saw:
// more than the writes before the fence), and a __threadfence acquires what
// the CTA's atomics so far read (the atomic read in one thread and the fence
// in another, a barrier between, as the kernels do it). Atomics on shared
// memory are left out: barriers order a CTA's threads.
void fence() {
  CtaRun& c = *g_cta;
  g_cur->fenced = true;
  for (size_t i = 0; i < c.n_atomics; ++i) race::acquire(c.atomics[i]);
}

void before_atomic(const void* p) {
  CtaRun& c = *g_cta;
  auto in = [p](const std::vector<unsigned char>& v) {
    return p >= static_cast<const void*>(v.data()) &&
           p < static_cast<const void*>(v.data() + v.size());
  };
  if (in(c.smem_store) || in(c.static_store)) return;
  if (g_cur->fenced) race::release(p);
  for (size_t i = 0; i < c.n_atomics; ++i)
    if (c.atomics[i] == p) return;
  if (c.n_atomics == std::size(c.atomics))
    fiber_fail("a CTA with atomics on more global addresses than the race check keeps");
  c.atomics[c.n_atomics++] = p;
}

void nc_read(const void* p, size_t n) {
  if (!race::kOn) return;
  void* const pc = __builtin_return_address(0);  // (in the kernel: the report's frame)
  void* const thread = race::current();
  race::to(race::nc_fiber());
  race::read_at(p, n, pc);
  race::to(thread);
}

int set_race_ctas(int n) {
  const int was = race::g_ctas_per_wave;
  race::g_ctas_per_wave = std::max(1, n);
  return was;
}

void run_grid(const Body& body, dim3 grid, dim3 block, size_t smem_bytes, size_t smem_limit) {
  const size_t n_ctas = size_t(grid.x) * grid.y * grid.z;
  const size_t n_threads = size_t(block.x) * block.y * block.z;
  size_t per_wave = race::kOn ? size_t(race::g_ctas_per_wave) : 1;
  per_wave = std::min({per_wave, race::kIdentities, kStacks / n_threads});
  const race::NcOrder nc_order;
  if (g_shuffle && per_wave == 1) {  // the CTAs in a random order
    std::vector<size_t> order(n_ctas);
    for (size_t i = 0; i < n_ctas; ++i) order[i] = i;
    for (size_t i = n_ctas; i > 1; --i) std::swap(order[i - 1], order[shuffled(i)]);
    for (size_t i : order) run_wave(body, i, 1, grid, block, smem_bytes, smem_limit);
    return;
  }
  for (size_t first = 0; first < n_ctas; first += per_wave)
    run_wave(body, first, std::min(per_wave, n_ctas - first), grid, block, smem_bytes, smem_limit);
}

uint64_t set_shuffle(uint64_t seed) {
  const uint64_t was = g_shuffle;
  g_shuffle = seed;
  g_shuffle_state = seed * 0x2545f4914f6cdd1dull;
  return was;
}

}  // namespace wick_emu
