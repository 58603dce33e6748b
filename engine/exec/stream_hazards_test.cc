// StreamHazards on a CpuDevice: a copy waits for the compute that touches its buffer in a
// conflicting way and for nothing else, seen by holding the compute stream behind a gate.
#include "engine/exec/stream_hazards.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/testing/stream_gate.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry::exec {
namespace {

struct Fixture {
  std::unique_ptr<CpuDevice> device;
  DeviceBuffer a, b;
  HostAllocation host;
  StreamHazards hazards;
};

Fixture Make() {
  Fixture f;
  CpuDeviceOptions o;
  o.memory_bytes = 1 << 20;
  Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  f.device = std::move(d).value();
  f.a = std::move(f.device->Allocate(4096, "a")).value();
  f.b = std::move(f.device->Allocate(4096, "b")).value();
  f.host = std::move(HostAllocation::Map(4096, "host")).value();
  constexpr std::string_view kNames[] = {"a", "b"};
  Result<StreamHazards> h = StreamHazards::Create(*f.device, kNames);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  f.hazards = std::move(h).value();
  return f;
}

// A copy on `stream` that reads (download) or writes (upload) `name`, through the tracker, then
// an event after it.
Result<Event> Copy(Fixture& f, StreamId stream, std::string_view name, const DeviceBuffer& buf) {
  const bool up = stream == StreamId::kUpload;
  FERRY_RETURN_IF_ERROR(up ? f.hazards.Before(stream, {}, {name})
                           : f.hazards.Before(stream, {name}, {}));
  FERRY_RETURN_IF_ERROR(up ? f.device->CopyToDevice(buf.data(), f.host.Span(0, 4096), 4096)
                           : f.device->CopyToHost(f.host.Span(0, 4096), buf.data(), 4096));
  FERRY_RETURN_IF_ERROR(up ? f.hazards.After(stream, {}, {name})
                           : f.hazards.After(stream, {name}, {}));
  FERRY_ASSIGN_OR_RETURN(Event e, f.device->CreateEvent());
  FERRY_RETURN_IF_ERROR(f.device->Record(e, stream));
  return e;
}

bool CompletesWithin(Device& d, const Event& e, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    Result<bool> done = d.Query(e);
    if (done.ok() && *done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

constexpr auto kBlocked = std::chrono::milliseconds(50);  // long enough to see a copy wait
constexpr auto kRuns = std::chrono::seconds(10);          // a copy that must not wait

struct CopySpec {
  StreamId stream;  // kUpload writes the buffer, kDownload reads it
  const char* buffer;
};

// Holds the compute stream behind a gate that reads `reads` and writes `writes`, then enqueues
// `runs` and `waits`: `runs` must complete while the gate is held, `waits` must not.
void ExpectOrder(StreamHazards::Names reads, StreamHazards::Names writes, CopySpec runs,
                 CopySpec waits) {
  Fixture f = Make();
  testing::Gate gate;
  ASSERT_TRUE(f.hazards.Before(StreamId::kCompute, reads, writes).ok());
  ASSERT_TRUE(f.device->LaunchHostFunc(StreamId::kCompute, [&] { return gate.Pass(); }).ok());
  ASSERT_TRUE(f.hazards.After(StreamId::kCompute, reads, writes).ok());
  auto buffer = [&](const char* name) -> const DeviceBuffer& {
    return std::string_view(name) == "a" ? f.a : f.b;
  };
  Result<Event> ran = Copy(f, runs.stream, runs.buffer, buffer(runs.buffer));
  Result<Event> waited = Copy(f, waits.stream, waits.buffer, buffer(waits.buffer));
  ASSERT_TRUE(ran.ok() && waited.ok());
  EXPECT_TRUE(CompletesWithin(*f.device, *ran, kRuns))
      << "the copy of '" << runs.buffer << "' waited for the held compute";
  EXPECT_FALSE(CompletesWithin(*f.device, *waited, kBlocked))
      << "the copy of '" << waits.buffer << "' ran while the held compute still used it";
  gate.Open();
  EXPECT_TRUE(f.device->Synchronize().ok());
}

// Read after write: while the compute stream writes "a", a download of "b" runs and a download of
// "a" waits.
TEST(StreamHazards, AReadWaitsForTheWritesOfItsBufferOnly) {
  ExpectOrder({}, {"a"}, {StreamId::kDownload, "b"}, {StreamId::kDownload, "a"});
}

// Write after read: while the compute stream reads "a", a download of "a" (read after read)
// runs and an upload into "a" waits.
TEST(StreamHazards, AWriteWaitsForReadsAndAReadDoesNot) {
  ExpectOrder({"a"}, {}, {StreamId::kDownload, "a"}, {StreamId::kUpload, "a"});
}

TEST(StreamHazards, UnknownBufferIsAnError) {
  Fixture f = Make();
  const Status s = f.hazards.Before(StreamId::kUpload, {}, {"nope"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace ferry::exec
