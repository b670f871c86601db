#include <gtest/gtest.h>
#include <sys/socket.h>

#include <deque>

#include "common/frame.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {
namespace {

TEST(FrameDecoder, SplitsAcrossFeeds) {
  ipc::ClientFrame f;
  f.mutable_hello()->set_job_id("job-1");
  f.mutable_hello()->set_local_rank(3);
  std::string body = f.SerializeAsString();
  std::string wire = encodeFrameHeader(body.size()) + body + encodeFrameHeader(body.size()) + body;
  FrameDecoder dec;
  std::string out;
  for (char c : wire) ASSERT_TRUE(dec.feed(&c, 1).isOk());
  ASSERT_TRUE(dec.next(&out));
  ipc::ClientFrame g;
  ASSERT_TRUE(g.ParseFromString(out));
  EXPECT_EQ(g.hello().job_id(), "job-1");
  EXPECT_EQ(g.hello().local_rank(), 3);
  ASSERT_TRUE(dec.next(&out));
  EXPECT_FALSE(dec.next(&out));
}

TEST(FrameDecoder, RejectsBadMagic) {
  FrameDecoder dec;
  std::string junk = "GET / HTTP/1.1\r\n\r\n";
  Status s = dec.feed(junk.data(), junk.size());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("bad magic"), std::string::npos) << s.message();
  std::string out;
  EXPECT_FALSE(dec.next(&out));
  EXPECT_FALSE(dec.feed("x", 1).isOk());  // stays poisoned
}

TEST(FrameDecoder, RejectsOversize) {
  FrameDecoder dec;
  std::string h = encodeFrameHeader(kMaxFrameBytes + 1);
  Status s = dec.feed(h.data(), h.size());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("oversize"), std::string::npos);
}

TEST(FrameDecoder, TruncatedFrameIsNotDelivered) {
  FrameDecoder dec;
  std::string h = encodeFrameHeader(100) + std::string(50, 'x');
  ASSERT_TRUE(dec.feed(h.data(), h.size()).isOk());
  std::string out;
  EXPECT_FALSE(dec.next(&out));
}

TEST(Frame, PassesDescriptorsOverSocketpair) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  UniqueFd pr(p[0]), pw(p[1]);
  ipc::AgentFrame f;
  f.mutable_welcome()->set_arena_bytes(123);
  ASSERT_TRUE(sendFrame(a.get(), f, {pw.get()}).isOk());
  FrameDecoder dec;
  std::deque<UniqueFd> fds;
  std::string payload;
  ASSERT_TRUE(recvFrame(b.get(), std::chrono::steady_clock::now() + std::chrono::seconds(5), &dec,
                        &fds, &payload)
                  .isOk());
  ipc::AgentFrame g;
  ASSERT_TRUE(g.ParseFromString(payload));
  EXPECT_EQ(g.welcome().arena_bytes(), 123u);
  ASSERT_EQ(fds.size(), 1u);
  ASSERT_EQ(::write(fds[0].get(), "z", 1), 1);  // the received fd is the pipe's write end
  char c = 0;
  ASSERT_EQ(::read(pr.get(), &c, 1), 1);
  EXPECT_EQ(c, 'z');
}

TEST(Frame, RecvTimesOut) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  FrameDecoder dec;
  std::deque<UniqueFd> fds;
  std::string payload;
  auto t0 = std::chrono::steady_clock::now();
  Status s = recvFrame(b.get(), t0 + std::chrono::milliseconds(50), &dec, &fds, &payload);
  EXPECT_EQ(s.code(), Code::kTimedOut);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

}  // namespace
}  // namespace kolo
