// The bf16 start-up notice: measured, and a warning exactly where bf16 is emulated.
#include "worker/host/bf16_probe.h"

#include <gtest/gtest.h>

namespace trainstep {
namespace {

CpuInfo Cpu(const std::string& flags) {
  return ParseCpuInfo("processor\t: 0\nmodel name\t: Test CPU\nflags\t: " + flags + "\n");
}

// Catches: a probe that measures nothing (zero times) or throws on this CPU.
TEST(Bf16ProbeTest, MeasuresBothPrecisions) {
  absl::StatusOr<Bf16Cost> cost = MeasureBf16Cost();
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_GT(cost->fp32_seconds, 0);
  EXPECT_GT(cost->bf16_seconds, 0);
}

// Catches: no warning on a CPU without native bf16, or one on a CPU that has it; a warning
// that does not say why or what it costs.
TEST(Bf16ProbeTest, WarnsWithReasonAndCostOnlyWhereBf16IsEmulated) {
  Bf16Cost cost;
  cost.fp32_seconds = 0.0001;
  cost.bf16_seconds = 0.0042;
  bool emulated = false;
  std::string notice = Bf16Notice(Cpu("avx2 avx512f"), cost, &emulated);
  EXPECT_TRUE(emulated);
  EXPECT_NE(notice.find("without native bf16"), std::string::npos) << notice;
  EXPECT_NE(notice.find("no avx512_bf16 or amx_bf16"), std::string::npos) << notice;
  EXPECT_NE(notice.find("42.0x its fp32 time"), std::string::npos) << notice;
  EXPECT_NE(notice.find("4.20 ms against 0.10 ms"), std::string::npos) << notice;
  EXPECT_NE(notice.find("precision fp32"), std::string::npos) << notice;

  notice = Bf16Notice(Cpu("avx2 avx512f avx512_bf16"), cost, &emulated);
  EXPECT_FALSE(emulated);
  EXPECT_NE(notice.find("native on this CPU (avx512_bf16)"), std::string::npos) << notice;

  notice = Bf16Notice(Cpu("avx2"), absl::InternalError("boom"), &emulated);
  EXPECT_TRUE(emulated);
  EXPECT_NE(notice.find("measurement failed: boom"), std::string::npos) << notice;
}

}  // namespace
}  // namespace trainstep
