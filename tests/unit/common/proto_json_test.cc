#include "common/proto_json.h"

#include <google/protobuf/util/json_util.h>

#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {
namespace {

// Catches: 64-bit integers quoted, a non-finite number written as NaN (not JSON), an unset
// optional field written as 0 (an absent probe read as a zero norm), a nested message in
// protobuf's mapping (quoted integers) instead of the record's, a repeated field dropped.
TEST(RecordToJsonTest, NestedRepeatedOptionalAndNonFinite) {
  v1::DroppedTail d;
  d.set_epoch(2);
  d.set_samples(3);
  d.set_first_position(8);
  for (int64_t id : {int64_t{9}, int64_t{1} << 40, int64_t{4}}) d.add_sample_ids(id);
  EXPECT_EQ(RecordToJson(d),
            R"({"epoch":2,"samples":3,"first_position":8,"sample_ids":[9,1099511627776,4]})");
  EXPECT_EQ(RecordToJson(v1::DroppedTail()),
            R"({"epoch":0,"samples":0,"first_position":0,"sample_ids":[]})");

  v1::UpdateRecord r;
  r.set_window_id(7);
  r.set_grad_norm_pre_clip(std::numeric_limits<double>::infinity());
  const std::string unset = RecordToJson(r);
  EXPECT_NE(unset.find(R"("window_id":7,)"), std::string::npos) << unset;
  EXPECT_NE(unset.find(R"("grad_norm_scaled":null,)"), std::string::npos) << unset;
  EXPECT_NE(unset.find(R"("grad_norm_pre_clip":null,)"), std::string::npos) << unset;
  EXPECT_NE(unset.find(R"("update_interval_seconds":null,)"), std::string::npos) << unset;
  EXPECT_NE(unset.find(R"("dropped_tail":null,)"), std::string::npos) << unset;
  EXPECT_NE(unset.find(R"("tail_window":false,)"), std::string::npos) << unset;

  r.set_grad_norm_scaled(0.0);  // set to zero is not unset
  r.set_update_interval_seconds(0.25);
  *r.mutable_dropped_tail() = d;
  const std::string set = RecordToJson(r);
  EXPECT_NE(set.find(R"("grad_norm_scaled":0,)"), std::string::npos) << set;
  EXPECT_NE(set.find(R"("update_interval_seconds":0.25,)"), std::string::npos) << set;
  EXPECT_NE(set.find(R"("dropped_tail":{"epoch":2,)"), std::string::npos) << set;

  // What it writes, protobuf's parser reads back (the CLI's and the Python client's readers).
  v1::UpdateRecord back;
  r.set_grad_norm_pre_clip(1.5);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(RecordToJson(r), &back).ok());
  EXPECT_EQ(back.SerializeAsString(), r.SerializeAsString());
}

}  // namespace
}  // namespace trainstep
