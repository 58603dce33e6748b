// NvmeStore's dispatcher thread: picks blocks from the priority queues, prepares them (the
// caller's pages for zero copy, else copy or compress into a bounce buffer), drives the IoEngine,
// checks every completion, resubmits short transfers and -EAGAIN, verifies and delivers reads, and
// finishes transfers.
//
// The CPU work on block data is kept off the path between a completion and the next submission:
// each round first refills the ring, then checksums the write blocks it just submitted (the disk
// reads them meanwhile; the caller may not change them until the transfer is done) and verifies
// the read blocks that completed in the previous round.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "offload/crc32c.h"
#include "offload/store_impl.h"

namespace ferry {
namespace {

constexpr int kMaxRetries = 1000;         // per block, for -EAGAIN, -EINTR and zero-byte progress
constexpr double kDefaultDiskRate = 1e9;  // until the store has measured its own
constexpr size_t kRemeasureBytes = size_t{256} << 20;
// Prepared blocks handed to the kernel per io_uring_submit (the first of a round goes alone, so
// the disk starts while the others are prepared).
constexpr size_t kSubmitBatch = 8;

// Whether memory can be handed to O_DIRECT I/O as it is: page-aligned and whole pages.
bool ZeroCopyable(const std::byte* p, size_t n) {
  return n > 0 && reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0 && n % kDirectAlign == 0;
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string Where(const Transfer& t, size_t block, uint64_t offset, const std::string& path) {
  switch (t.kind) {
    case Transfer::Kind::kWrite:
      return "writing block " + std::to_string(block) + " of entry '" + t.name + "' to " + path +
             " at offset " + std::to_string(offset);
    case Transfer::Kind::kRead:
      return "reading block " + std::to_string(block) + " of entry '" + t.name + "' from " + path +
             " at offset " + std::to_string(offset);
    case Transfer::Kind::kReadExternal:
      return "reading " + t.name + " at offset " + std::to_string(offset);
  }
  return "";
}

// Points a block's I/O at its slot: the stored payload rounded up to the O_DIRECT alignment.
void AimAtSlot(const StoredBlock& sb, IoKind kind, InflightBlock& b) {
  b.io_len = uint32_t(AlignUp(sb.stored_len, kDirectAlign));
  b.needed = b.io_len;
  b.file_offset = sb.slot.offset;
  b.request.kind = kind;
  b.request.fd = sb.slot.fd;
}

}  // namespace

double NvmeStore::Impl::DiskRate() const {
  if (options.disk_bytes_per_s > 0) return options.disk_bytes_per_s;
  const double bytes = double(disk_written.load() + disk_read.load());
  if (busy_seconds < 0.01 || bytes < double(64 << 20)) return kDefaultDiskRate;
  return bytes / busy_seconds;
}

void NvmeStore::Impl::Run() {
  std::vector<IoCompletion> completions;
  struct Work {
    std::shared_ptr<Transfer> t;
    size_t block;
    unsigned buffer;
  };
  std::vector<Work> work;
  std::vector<std::shared_ptr<Transfer>> finished;
  for (;;) {
    work.clear();
    finished.clear();
    bool stopping;
    {
      std::lock_guard lock(mu);
      stopping = stop;
      if (stopping) {
        queues.Drain([&](std::shared_ptr<Transfer>& t) {
          if (t->status.ok()) t->status = Status::Cancelled("the NVMe store is shutting down");
          // Nothing more dispatched; the last completion finishes it.
          t->next_block = t->num_blocks;
          if (t->inflight == 0) finished.push_back(t);
        });
      }
      while (!free_buffers.empty()) {
        const int q = queues.Pick();
        if (q < 0) break;
        std::shared_ptr<Transfer>& t = queues.Front(q);
        if (!t->status.ok()) {            // failed earlier: dispatch nothing more
          t->next_block = t->num_blocks;  // the last completion in flight finishes it
          if (t->inflight == 0) finished.push_back(t);
          queues.PopFront(q);
          continue;
        }
        const unsigned buffer = free_buffers.back();
        free_buffers.pop_back();
        ++t->inflight;
        work.push_back({t, t->next_block++, buffer});
        if (t->next_block == t->num_blocks) queues.PopFront(q);
      }
    }
    for (auto& t : finished) Finalize(t);
    size_t unsubmitted = 0;  // work[i - unsubmitted .. i] are pushed but not yet submitted
    for (size_t i = 0; i < work.size(); ++i) {
      Start(work[i].t, work[i].block, work[i].buffer);
      ++unsubmitted;
      if (i != 0 && unsubmitted < kSubmitBatch && i + 1 != work.size()) continue;
      if (Status s = engine->Flush(); !s.ok()) {
        for (size_t j = i + 1 - unsubmitted; j <= i; ++j) {
          Transfer& t = *work[j].t;  // its completions still arrive
          if (t.status.ok()) t.status = s.WithContext("NVMe store dispatcher");
        }
      }
      unsubmitted = 0;
    }
    // Refilled: now the CPU work, while the disk works. Buffers it frees are used at once.
    if (AfterSubmit()) continue;
    if (inflight_count == 0 && stopping) return;
    completions.clear();
    const auto wait_start = std::chrono::steady_clock::now();
    if (Status s = engine->Wait(completions); !s.ok()) {
      Log("NVMe store: waiting for completions failed: " + s.ToString());
    }
    if (inflight_count > 0) {
      busy_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
    }
    for (const IoCompletion& c : completions) OnCompletion(c);
  }
}

void NvmeStore::Impl::Start(const std::shared_ptr<Transfer>& tp, size_t block, unsigned buffer) {
  Transfer& t = *tp;
  const size_t B = options.block_bytes;
  InflightBlock& b = inflight[buffer];
  b.transfer = tp;
  b.block = block;
  b.buf = bounce.data() + size_t(buffer) * B;
  b.zero_copy = false;
  b.done = 0;
  b.retries = 0;
  IoRequest& r = b.request;
  r.user_data = buffer;
  switch (t.kind) {
    case Transfer::Kind::kWrite: {
      StoredBlock& sb = t.version->blocks[block];
      const auto data = t.src.subspan(block * B, std::min(B, t.src.size() - block * B));
      if (block == 0 && t.compression == Compression::kAuto) {
        if (auto_bytes_left == 0) {
          const CodecMeasurement m = codec.Measure(data);
          auto_decision = ZstdCodec::Pays(m, DiskRate());
          auto_bytes_left = kRemeasureBytes;
        }
        auto_bytes_left -= std::min(auto_bytes_left, t.src.size());
        (auto_decision ? decisions_yes : decisions_no).fetch_add(1, std::memory_order_relaxed);
      }
      if (block == 0) {
        t.compress = t.compression == Compression::kAlways ||
                     (t.compression == Compression::kAuto && auto_decision);
      }
      sb.compressed = false;
      if (t.compress && data.size() > kDirectAlign) {
        // Compression must save at least one aligned page to be worth a decompression.
        auto n = codec.Compress(data, {b.buf, AlignUp(data.size(), kDirectAlign) - kDirectAlign});
        if (n.ok()) {
          sb.compressed = true;
          sb.stored_len = uint32_t(*n);
          compressed_blocks.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!sb.compressed) {
        sb.stored_len = uint32_t(data.size());
        if (ZeroCopyable(data.data(), data.size())) {
          b.zero_copy = true;
          b.buf = const_cast<std::byte*>(data.data());  // a write only reads it
        } else {
          std::memcpy(b.buf, data.data(), data.size());
        }
      }
      AimAtSlot(sb, IoKind::kWrite, b);
      if (!b.zero_copy) std::memset(b.buf + sb.stored_len, 0, b.io_len - sb.stored_len);
      crc_pending.push_back(buffer);  // sb.crc: once submitted (AfterSubmit)
      break;
    }
    case Transfer::Kind::kRead: {
      const StoredBlock& sb = t.version->blocks[block];
      AimAtSlot(sb, IoKind::kRead, b);
      std::byte* out = t.dst.data() + block * B;
      if (!sb.compressed && sb.stored_len == std::min(B, t.dst.size() - block * B) &&
          ZeroCopyable(out, sb.stored_len)) {
        b.zero_copy = true;
        b.buf = out;
      }
      break;
    }
    case Transfer::Kind::kReadExternal: {
      b.file_offset = t.aligned_begin + block * B;
      b.io_len = uint32_t(std::min<uint64_t>(B, t.aligned_end - b.file_offset));
      b.needed = uint32_t(std::min<uint64_t>(b.io_len, t.file_size - b.file_offset));
      r.kind = IoKind::kRead;
      r.fd = t.fd;
      // Straight into dst when the block's whole aligned range lies inside the bytes asked for.
      if (b.file_offset >= t.offset && b.file_offset + b.io_len <= t.offset + t.dst.size()) {
        std::byte* out = t.dst.data() + (b.file_offset - t.offset);
        if (ZeroCopyable(out, b.io_len)) {
          b.zero_copy = true;
          b.buf = out;
        }
      }
      break;
    }
  }
  if (b.zero_copy) zero_copy_blocks.fetch_add(1, std::memory_order_relaxed);
  // The caller's pages are not registered with the ring: those go as plain reads and writes.
  r.buf_index = !b.zero_copy && buffer < engine->registered_buffers() ? int(buffer) : -1;
  r.buf = b.buf;
  r.len = b.io_len;
  r.offset = b.file_offset;
  ++inflight_count;
  engine->Push(r);
}

void NvmeStore::Impl::OnCompletion(const IoCompletion& c) {
  InflightBlock& b = inflight[c.user_data];
  Transfer& t = *b.transfer;
  const int res = c.res;
  Status error;
  const auto where = [&] {
    std::string path = t.kind == Transfer::Kind::kReadExternal
                           ? t.name
                           : allocator->SegmentPath(t.version->blocks[b.block].slot.segment);
    return Where(t, b.block, b.file_offset, path);
  };
  bool resubmit = false;
  if (res == -EAGAIN || res == -EINTR) {
    again_resubmits.fetch_add(1, std::memory_order_relaxed);
    resubmit = true;
  } else if (res < 0) {
    error = Status::FromErrno(-res, where());
  } else {
    const uint32_t total = b.done + uint32_t(res);
    if (total < b.needed) {
      // Short transfer: go on from the last aligned byte (O_DIRECT needs aligned offsets;
      // re-transferring a few bytes is harmless for reads and writes alike).
      short_resubmits.fetch_add(1, std::memory_order_relaxed);
      const uint32_t restart = direct ? total / kDirectAlign * kDirectAlign : total;
      if (res == 0 || restart == b.done) ++b.retries;  // no usable progress
      b.done = restart;
      b.request.buf = b.buf + restart;
      b.request.len = b.io_len - restart;
      b.request.offset = b.file_offset + restart;
      resubmit = true;
    }
  }
  if (resubmit) {
    if (++b.retries > kMaxRetries) {
      error = Status::IOError(where() + ": no progress after " + std::to_string(kMaxRetries) +
                              " resubmissions (last result " + std::to_string(res) + ")");
    } else if (t.status.ok()) {
      // The engine slot was freed with this completion; the next Flush or Wait submits it.
      engine->Push(b.request);
      return;
    }  // else the transfer already failed: stop here
  }
  --inflight_count;
  if (error.ok() && !resubmit) {
    // Transferred: finished (verified, copied out) by AfterSubmit, once the ring is refilled. The
    // slot is free now unless the block's data is still to be copied out of its bounce buffer.
    const bool keep_buffer = !b.zero_copy && t.kind != Transfer::Kind::kWrite;
    completed.push_back({std::move(b), keep_buffer ? int(c.user_data) : -1});
    if (!keep_buffer) free_buffers.push_back(unsigned(c.user_data));
    return;
  }
  free_buffers.push_back(unsigned(c.user_data));
  EndBlock(b, std::move(error));
}

bool NvmeStore::Impl::AfterSubmit() {
  for (const unsigned i : crc_pending) {
    const InflightBlock& b = inflight[i];
    StoredBlock& sb = b.transfer->version->blocks[b.block];
    sb.crc = Crc32c({b.buf, sb.stored_len});
  }
  crc_pending.clear();
  bool freed = false;
  for (CompletedBlock& c : completed) {
    Status s = FinishBlock(c.block);
    if (c.kept_buffer >= 0) {
      free_buffers.push_back(unsigned(c.kept_buffer));
      freed = true;
    }
    EndBlock(c.block, std::move(s));
  }
  completed.clear();
  return freed;
}

void NvmeStore::Impl::EndBlock(InflightBlock& b, Status error) {
  Transfer& t = *b.transfer;
  if (!error.ok() && t.status.ok()) t.status = std::move(error);
  --t.inflight;
  const std::shared_ptr<Transfer> tp = std::move(b.transfer);
  // A failed transfer that is still queued is popped (and finished) by the dispatch loop.
  if (t.inflight == 0 && t.next_block == t.num_blocks) Finalize(tp);
}

Status NvmeStore::Impl::FinishBlock(InflightBlock& b) {
  Transfer& t = *b.transfer;
  const size_t B = options.block_bytes;
  switch (t.kind) {
    case Transfer::Kind::kWrite: {
      bytes_written.fetch_add(std::min(B, t.src.size() - b.block * B), std::memory_order_relaxed);
      disk_written.fetch_add(b.io_len, std::memory_order_relaxed);
      return Status::Ok();
    }
    case Transfer::Kind::kRead: {
      const StoredBlock& sb = t.version->blocks[b.block];
      disk_read.fetch_add(b.io_len, std::memory_order_relaxed);
      const uint32_t crc = Crc32c({b.buf, sb.stored_len});
      if (crc != sb.crc) {
        checksum_failures.fetch_add(1, std::memory_order_relaxed);
        return Status::Corruption(
            "block " + std::to_string(b.block) + " of entry '" + t.name + "' (" +
            allocator->SegmentPath(sb.slot.segment) + " at offset " +
            std::to_string(sb.slot.offset) + ") failed its CRC-32C check: stored " + Hex(sb.crc) +
            ", read " + Hex(crc) + "; the data on disk is damaged (check the drive's health)");
      }
      const auto out = t.dst.subspan(b.block * B, std::min(B, t.dst.size() - b.block * B));
      if (sb.compressed) {
        FERRY_RETURN_IF_ERROR(
            codec.Decompress({b.buf, sb.stored_len}, out)
                .WithContext("block " + std::to_string(b.block) + " of entry '" + t.name + "'"));
      } else if (!b.zero_copy) {
        std::memcpy(out.data(), b.buf, out.size());
      }
      bytes_read.fetch_add(out.size(), std::memory_order_relaxed);
      return Status::Ok();
    }
    case Transfer::Kind::kReadExternal: {
      disk_read.fetch_add(b.needed, std::memory_order_relaxed);
      // The block covers file bytes [file_offset, file_offset + io_len); copy the part asked for.
      const uint64_t lo = std::max<uint64_t>(b.file_offset, t.offset);
      const uint64_t hi = std::min<uint64_t>(b.file_offset + b.io_len, t.offset + t.dst.size());
      if (!b.zero_copy) {
        std::memcpy(t.dst.data() + (lo - t.offset), b.buf + (lo - b.file_offset), hi - lo);
      }
      bytes_read.fetch_add(hi - lo, std::memory_order_relaxed);
      return Status::Ok();
    }
  }
  return Status::Internal("unknown transfer kind");
}

void NvmeStore::Impl::Finalize(const std::shared_ptr<Transfer>& t) {
  Status s = t->status;
  if (t->kind == Transfer::Kind::kWrite && s.ok()) {
    std::shared_ptr<EntryVersion> replaced;  // released outside the lock
    std::lock_guard lock(mu);
    auto& slot = index[t->name];
    replaced = std::move(slot);
    slot = std::move(t->version);
  }
  t->version.reset();  // a failed write frees its slots; a read lets go of its snapshot
  t->handle->Finish(std::move(s));
}

}  // namespace ferry
