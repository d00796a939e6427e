// The model export's meta.json (attnlab/io/model_export.hpp): every message says what is wrong — "key" absent or not
// lowercase hex, "bidirectional" absent or not a boolean — and what a valid export is; any [0-9a-f]+ key is accepted.
// And the sidecars through which the user's .npy files say whether their model is causal (mask_statement()).
#include "attnlab/core/error.hpp"
#include "attnlab/io/model_export.hpp"
#include "attnlab/io/npy.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace attnlab {
namespace {

namespace fs = std::filesystem;

// This process's scratch directory, removed after each test.
fs::path scratch() { return fs::temp_directory_path() / ("attnlab_test_export_" + std::to_string(::getpid())); }

class ModelExport : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(scratch()); }
};

// A fresh directory: DIR/meta.json holding `meta`, and DIR/captured/seq{s}_layer0_q.npy for s < seqs.
std::string make_export(const std::string& name, const std::string& meta, int seqs = 1) {
  const fs::path dir = scratch() / name;
  fs::remove_all(dir);
  fs::create_directories(dir / "captured");
  if (!meta.empty()) std::ofstream(dir / "meta.json") << meta;
  const std::vector<float> zeros(2 * 4 * 3, 0.0f);
  for (int s = 0; s < seqs; ++s)
    write_npy<float>((dir / "captured" / ("seq" + std::to_string(s) + "_layer0_q.npy")).string(), zeros.data(),
                     {2, 4, 3});
  return dir.string();
}

std::string message_of(const std::string& dir) {
  try {
    ModelData data(dir, "captured");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(ModelExport, AKeyThatIsNotLowercaseHexIsNamedWithAValidExport) {
  const std::string dir = make_export("mygpt", R"({"key": "mygpt", "bidirectional": true})");
  const std::string m = message_of(dir);
  EXPECT_NE(m.find(dir + "/meta.json: \"key\" is \"mygpt\", not a string of lowercase hex digits ([0-9a-f]+"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("has no \"key\""), std::string::npos) << m;
  EXPECT_NE(m.find("a valid export is " + dir + "/meta.json, a JSON object with \"key\": \"<lowercase hex>\" and "
                   "\"bidirectional\": true|false"), std::string::npos) << m;
  EXPECT_NE(m.find(dir + "/captured/seq{s}_layer{l}_{q,k,v}.npy"), std::string::npos) << m;
  for (const char* bad : {R"({"key": "3F9A", "bidirectional": true})", R"({"key": 42, "bidirectional": true})",
                          R"({"key": "", "bidirectional": true})"}) {
    const std::string m2 = message_of(make_export("bad", bad));
    EXPECT_NE(m2.find("not a string of lowercase hex digits"), std::string::npos) << bad << ": " << m2;
  }
}

TEST_F(ModelExport, AnAbsentKeyIsSaidToBeAbsent) {
  const std::string m = message_of(make_export("nokey", R"({"bidirectional": true})"));
  EXPECT_NE(m.find("meta.json has no \"key\" (a string of lowercase hex digits"), std::string::npos) << m;
  EXPECT_NE(m.find("a valid export is"), std::string::npos) << m;
}

TEST_F(ModelExport, AnyLowercaseHexKeyIsAccepted) {
  for (const char* key : {"0", "deadbeef", "0123456789abcdef0123"}) {
    const std::string dir = make_export("hex", std::string(R"({"key": ")") + key + R"(", "bidirectional": false})", 3);
    const ModelData data(dir, "captured");
    EXPECT_EQ(data.key(), key);
    EXPECT_FALSE(data.bidirectional());
    EXPECT_EQ(data.sequences(), 3);
    EXPECT_EQ(data.mask().causal, std::optional<bool>(true));
    EXPECT_EQ(data.mask().said_by, dir + "/meta.json");
  }
}

TEST_F(ModelExport, BidirectionalAbsentOrNotABooleanIsNamed) {
  std::string m = message_of(make_export("nobidi", R"({"key": "ab"})"));
  EXPECT_NE(m.find("meta.json has no \"bidirectional\" (true, or false for a causal model); a valid export is"),
            std::string::npos) << m;
  m = message_of(make_export("yes", R"({"key": "ab", "bidirectional": "yes"})"));
  EXPECT_NE(m.find("meta.json: \"bidirectional\" is \"yes\", not true or false (a JSON boolean: false for a causal "
                   "model); a valid export is"), std::string::npos) << m;
}

TEST_F(ModelExport, TheMakeHintIsTheCallersOrTrainedAttentions) {
  const std::string dir = make_export("hint", R"({"key": "mygpt", "bidirectional": true})");
  try {
    ModelData data(dir, "trained");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tools/trained_attention.py --out " + dir), std::string::npos) << e.what();
  }
  try {
    ModelData data(dir, "captured", "", "attnlab.torch.capture(model).save(DIR) writes one");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("; attnlab.torch.capture(model).save(DIR) writes one"), std::string::npos)
        << e.what();
  }
}

TEST_F(ModelExport, MaskStatementsOfSidecars) {
  const fs::path dir = make_export("sidecar", "", 2);
  const std::string q = (dir / "captured" / "seq1_layer0_q.npy").string();
  EXPECT_FALSE(mask_statement(q).causal) << "a bare file says nothing";
  std::ofstream(dir / "meta.json") << R"({"key": "ab", "bidirectional": false})";  // the export's, above captured/
  MaskStatement s = mask_statement(q);
  EXPECT_EQ(s.causal, std::optional<bool>(true));
  EXPECT_EQ(s.said_by, (dir / "meta.json").string());
  std::ofstream(dir / "captured" / "meta.json") << R"({"bidirectional": true})";  // beside the file: first
  EXPECT_EQ(mask_statement(q).causal, std::optional<bool>(false));
  std::ofstream(q + ".json") << R"({"causal": true})";  // FILE.npy.json: first of all
  s = mask_statement(q);
  EXPECT_EQ(s.causal, std::optional<bool>(true));
  EXPECT_EQ(s.said_by, q + ".json");
  std::ofstream(q + ".json") << R"({"causal": "maybe"})";
  EXPECT_THROW(mask_statement(q), Error);
  std::ofstream(q + ".json") << R"({"causal": true, "bidirectional": true})";
  try {
    mask_statement(q);
    FAIL() << "a sidecar that contradicts itself was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"causal\": true and \"bidirectional\": true disagree"), std::string::npos)
        << e.what();
  }
  std::ofstream(q + ".json") << R"({"note": "no statement"})";  // says nothing: the next sidecar speaks
  EXPECT_EQ(mask_statement(q).causal, std::optional<bool>(false));
}

}  // namespace
}  // namespace attnlab
