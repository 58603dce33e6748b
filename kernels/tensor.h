// Typed device pointers and tensor views.
//
// Device memory is not host memory: a DevicePtr<T> cannot be dereferenced by host code, on the
// CPU device too. Only device implementations unwrap it, through BackendAccess
// (kernels/backend_access.h), which nothing above kernels/ includes.
//
// A Tensor is a non-owning view: a DevicePtr, a dtype and a row-major contiguous shape. Memory is
// owned by a DeviceBuffer (kernels/device.h); views never outlive it (the caller's duty).
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernels/dtype.h"

namespace ferry {

class BackendAccess;

template <typename T>
class DevicePtr {
 public:
  DevicePtr() = default;
  bool is_null() const { return p_ == nullptr; }
  explicit operator bool() const { return p_ != nullptr; }
  DevicePtr operator+(std::ptrdiff_t n) const { return DevicePtr(p_ + n); }
  // Reinterprets the pointee type (byte offsets stay the caller's duty).
  template <typename U>
  DevicePtr<U> As() const { return DevicePtr<U>(reinterpret_cast<U*>(const_cast<std::remove_const_t<T>*>(p_))); }
  // The address as a number, for logs, alignment checks and comparisons only.
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(p_); }
  bool operator==(const DevicePtr& o) const { return p_ == o.p_; }
  // A pointer to mutable memory converts to a pointer to const memory, as T* does.
  operator DevicePtr<const T>() const requires(!std::is_const_v<T>) {  // NOLINT
    return DevicePtr<const T>(p_);
  }

 private:
  template <typename U> friend class DevicePtr;
  friend class BackendAccess;
  explicit DevicePtr(T* p) : p_(p) {}
  T* p_ = nullptr;
};

// Row-major shape of rank 0..4.
class Shape {
 public:
  static constexpr int kMaxRank = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    assert(dims.size() <= kMaxRank);
    for (int64_t d : dims) dims_[rank_++] = d;
  }
  int rank() const { return rank_; }
  int64_t operator[](int i) const { assert(i >= 0 && i < rank_); return dims_[i]; }
  int64_t& operator[](int i) { assert(i >= 0 && i < rank_); return dims_[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i) if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  std::string ToString() const;  // "[2, 3, 4]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

struct Tensor {
  DevicePtr<std::byte> data;
  DType dtype = DType::kF32;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return size_t(numel()) * DTypeSize(dtype); }
  int64_t dim(int i) const { return shape[i]; }
  // Rows [begin, end) of the leading dimension.
  Tensor Rows(int64_t begin, int64_t end) const {
    assert(shape.rank() >= 1 && 0 <= begin && begin <= end && end <= shape[0]);
    Tensor t = *this;
    const int64_t row = shape[0] == 0 ? 0 : numel() / shape[0];
    t.data = data + std::ptrdiff_t(begin * row * int64_t(DTypeSize(dtype)));
    t.shape[0] = end - begin;
    return t;
  }
  // Same memory, another shape with the same element count.
  Tensor Reshape(Shape s) const {
    assert(s.numel() == numel());
    Tensor t = *this;
    t.shape = s;
    return t;
  }
  std::string ToString() const;  // "bf16[2, 3]"
};

}  // namespace ferry
