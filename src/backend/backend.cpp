#include "backend/backend.h"

#include <stdexcept>

#include "backend/cpu/cpu_backend.h"
#ifdef WICK_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace wick {

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    be_ = o.be_;
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.be_ = nullptr;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (be_ && p_) be_->release(p_);
  be_ = nullptr;
  p_ = nullptr;
  bytes_ = 0;
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::Cpu;
  if (s == "cuda" || s == "gpu") return Device::Cuda;
  if (s == "auto" || s.empty()) return Device::Auto;
  throw std::runtime_error("device '" + s + "': expected cpu, cuda or auto");
}

const char* device_name(Device d) {
  switch (d) {
    case Device::Cpu:
      return "cpu";
    case Device::Cuda:
      return "cuda";
    default:
      return "auto";
  }
}

bool cuda_available() {
#ifdef WICK_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const BackendOptions& opt) {
  Device d = opt.device;
  if (d == Device::Auto) d = cuda_available() ? Device::Cuda : Device::Cpu;
  const std::string& kv = opt.kv_cache_dtype;
  if (!kv.empty() && kv != "f32" && kv != "f16" && kv != "bf16" && kv != "q8_0")
    throw std::runtime_error("--kv-cache-dtype " + kv + ": expected f32, f16, bf16 or q8_0");
  if (d == Device::Cpu)
    return make_cpu_backend(kv == "f16"    ? DType::F16
                            : kv == "bf16" ? DType::BF16
                            : kv == "q8_0" ? DType::Q8_0
                                           : DType::F32);
  // the GPU's cache: f16 or q8_0, f32 with --gpu-f32 (its kernels pair f32
  // weights with an f32 cache)
  if (!kv.empty() && (opt.gpu_f32 ? kv != "f32" : kv == "f32" || kv == "bf16"))
    throw std::runtime_error("--kv-cache-dtype " + kv + " on the GPU: its cache is f16 or q8_0, " +
                             "f32 with --gpu-f32");
#ifdef WICK_CUDA
  if (cuda_device_count() == 0)
    throw std::runtime_error("--device cuda: no CUDA GPU is visible (" + cuda_status() + ")");
  return make_cuda_backend(opt);
#else
  throw std::runtime_error(
      "--device cuda: this wick was built without CUDA (configure with -DWICK_CUDA=ON and a CUDA "
      "toolkit)");
#endif
}

}  // namespace wick
