// StreamedInput (agent/core/streamed_input.h): the negotiation thread's wait
// for trainers that copy their tensors into the arena after publishing them.
#include "agent/core/streamed_input.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace kolo {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(StreamedInput, WaitsForTheSlowestRankToCoverTheEnd) {
  std::atomic<uint64_t> a{0}, b{0};
  auto error = std::make_shared<FirstError>();
  StreamedInput in("t", 4 << 20, {{&a, 0}, {&b, 1}}, error);
  std::atomic<bool> stop{false};
  a.store(4 << 20);
  std::thread copier([&] {
    for (uint64_t done = 0; done < (4u << 20);) {
      std::this_thread::sleep_for(milliseconds(5));
      done += 1 << 20;
      b.store(done, std::memory_order_release);
    }
  });
  in.await(2 << 20, stop, milliseconds(5000));
  EXPECT_GE(b.load(), uint64_t{2} << 20);
  EXPECT_EQ(in.copied() >= (2u << 20), true);
  in.await(uint64_t{1} << 40, stop, milliseconds(5000));  // past the tensor: its whole size
  EXPECT_EQ(b.load(), uint64_t{4} << 20);
  EXPECT_EQ(in.copied(), uint64_t{4} << 20);
  copier.join();
  EXPECT_FALSE(error->failed());
}

TEST(StreamedInput, ARankThatStopsCopyingFailsWithItsNameAfterTheStall) {
  std::atomic<uint64_t> a{8 << 20}, b{3 << 20};
  auto error = std::make_shared<FirstError>();
  StreamedInput in("layer1.weight", 8 << 20, {{&a, 0}, {&b, 1}}, error);
  std::atomic<bool> stop{false};
  const auto start = Clock::now();
  in.await(8 << 20, stop, milliseconds(200));
  const auto took = Clock::now() - start;
  EXPECT_GE(took, milliseconds(200));
  EXPECT_LT(took, milliseconds(2000));
  ASSERT_TRUE(error->failed());
  EXPECT_EQ(error->get().code(), Code::kTimedOut);
  EXPECT_EQ(
      error->get().message(),
      "local rank 1 copied 3145728 of the 8388608 bytes of tensor 'layer1.weight' into the arena "
      "and then nothing for 200 ms (the trainer died or hung inside its submission)");
  // Failed: later waits return at once.
  const auto again = Clock::now();
  in.await(8 << 20, stop, milliseconds(200));
  EXPECT_LT(Clock::now() - again, milliseconds(100));
}

TEST(StreamedInput, ProgressResetsTheStallAndStopEndsTheWait) {
  std::atomic<uint64_t> a{0};
  auto error = std::make_shared<FirstError>();
  StreamedInput in("t", 64 << 20, {{&a, 0}}, error);
  std::atomic<bool> stop{false};
  // Slow but moving (a step every 60 ms against a 150 ms stall): no error.
  std::thread copier([&] {
    for (int i = 1; i <= 6; ++i) {
      std::this_thread::sleep_for(milliseconds(60));
      a.store(uint64_t(i) << 20, std::memory_order_release);
    }
  });
  in.await(6 << 20, stop, milliseconds(150));
  copier.join();
  EXPECT_FALSE(error->failed()) << error->get().message();
  // The job stops (an abort): the wait ends without an error of its own.
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(50));
    stop.store(true);
  });
  const auto start = Clock::now();
  in.await(64 << 20, stop, milliseconds(10000));
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  stopper.join();
  EXPECT_FALSE(error->failed());
}

}  // namespace
}  // namespace kolo
