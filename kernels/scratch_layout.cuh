// Carves one scratch allocation into aligned sub-buffers, so every CUDA
// launcher asks the caller for a single block of temporary device memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jss {
namespace cuda {

class ScratchLayout {
 public:
  static constexpr size_t kAlign = 256;  // what cudaMalloc guarantees; enough for CUB

  // Reserves `bytes` and returns its offset from the start of the allocation.
  size_t add(size_t bytes) {
    const size_t offset = total_;
    total_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return offset;
  }
  size_t total() const { return total_; }

  template <typename T>
  static T* at(void* base, size_t offset) {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
  }

 private:
  size_t total_ = 0;
};

}  // namespace cuda
}  // namespace jss
