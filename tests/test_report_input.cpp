// What the report states about its input and the one causal rule (report/report.hpp): causal_rule() for a capture
// that says causal or bidirectional, and for bare arrays; input_notes() naming the sequence of a capture of several;
// load_model_export() and files_origin() feeding them; a hand-written meta.json's key named with a valid export.
#include "attnlab/core/error.hpp"
#include "attnlab/io/npy.hpp"
#include "report.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>

namespace attnlab::report {
namespace {

namespace fs = std::filesystem;

// DIR/meta.json (`meta`) and DIR/captured/seq{s}_layer0_{q,k,v}.npy, (1, 8, 4), for s < seqs.
fs::path make_export(const std::string& name, const std::string& meta, int seqs) {
  const fs::path dir = fs::temp_directory_path() / ("attnlab_test_report_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir / "captured");
  std::ofstream(dir / "meta.json") << meta;
  std::vector<float> x(8 * 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) * 0.1f;
  for (int s = 0; s < seqs; ++s)
    for (const char* w : {"q", "k", "v"})
      write_npy<float>((dir / "captured" / ("seq" + std::to_string(s) + "_layer0_" + w + ".npy")).string(), x.data(),
                       {1, 8, 4});
  return dir;
}

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReportInput, BareInputIsTreatedAsGivenAndSaysSo) {
  EXPECT_EQ(causal_rule(Origin{}, false),
            "attention treated as bidirectional (non-causal): pass --causal if the model is causal");
  EXPECT_EQ(causal_rule(Origin{}, true), "attention treated as causal (--causal)");
}

TEST(ReportInput, ACaptureSayingCausalOrBidirectionalMustBeAgreedWith) {
  Origin o;
  o.input = "export";
  o.mask = {true, "export/meta.json"};
  EXPECT_EQ(causal_rule(o, true), "attention causal, as export/meta.json says");
  std::string m = message([&] { causal_rule(o, false); });
  EXPECT_NE(m.find("report: the attention in export is a causal model's (as export/meta.json says); add --causal"),
            std::string::npos) << m;
  o.mask = {false, "q.npy.json"};
  EXPECT_EQ(causal_rule(o, false), "attention bidirectional (non-causal), as q.npy.json says");
  m = message([&] { causal_rule(o, true); });
  EXPECT_NE(m.find("is a bidirectional model's (as q.npy.json says); drop --causal"), std::string::npos) << m;
}

TEST(ReportInput, TheExportPathAndTheFilesPathShareTheRule) {
  const fs::path dir = make_export("rule", R"({"key": "0a", "bidirectional": false})", 3);
  // --model-dir: refused without --causal, and with it the notes name the sequence and the mask.
  std::string m = message([&] { load_model_export(dir.string(), "all", 1, false); });
  EXPECT_NE(m.find("add --causal"), std::string::npos) << m;
  const std::vector<Layer> layers = load_model_export(dir.string(), "all", 1, true);
  EXPECT_EQ(input_notes(layers, true),
            (std::vector<std::string>{"sequence 1 of 3 (use --seq S for another)",
                                      "attention causal, as " + (dir / "meta.json").string() + " says"}));
  // The same capture's files: the export's meta.json speaks for them, and the sequence is named.
  const fs::path part = dir / "captured";
  const Origin o = files_origin((part / "seq2_layer0_q.npy").string(), (part / "seq2_layer0_k.npy").string(),
                                (part / "seq2_layer0_v.npy").string());
  m = message([&] { causal_rule(o, false); });
  EXPECT_NE(m.find("add --causal"), std::string::npos) << m;
  Layer l;
  l.origin = o;
  EXPECT_EQ(input_notes({l}, true),
            (std::vector<std::string>{"sequence 2 of 3 (use --model-dir " + part.string() +
                                          " --layers 0 --seq S for another)",
                                      "attention causal, as " + (dir / "meta.json").string() + " says"}));
  // A sidecar of one file contradicting the export's meta.json: which is it?
  std::ofstream(part / "seq2_layer0_k.npy.json") << R"({"causal": false})";
  m = message([&] {
    files_origin((part / "seq2_layer0_q.npy").string(), (part / "seq2_layer0_k.npy").string(),
                 (part / "seq2_layer0_v.npy").string());
  });
  EXPECT_NE(m.find("says the model is causal"), std::string::npos) << m;
  EXPECT_NE(m.find("seq2_layer0_k.npy.json that it is bidirectional"), std::string::npos) << m;
  fs::remove_all(dir);
}

TEST(ReportInput, AHandWrittenKeyIsNamedWithBothWaysToMakeAnExport) {
  const fs::path dir = make_export("mygpt", R"({"key": "mygpt", "bidirectional": true})", 1);
  const std::string m = message([&] { load_model_export(dir.string(), "all", 0, false); });
  EXPECT_NE(m.find("\"key\" is \"mygpt\", not a string of lowercase hex digits"), std::string::npos) << m;
  EXPECT_NE(m.find("attnlab.torch.capture(model).save(" + dir.string() + ") writes one for your model"),
            std::string::npos) << m;
  EXPECT_NE(m.find("tools/trained_attention.py --out " + dir.string() + " the project's"), std::string::npos) << m;
  EXPECT_EQ(m.find("make it with"), std::string::npos) << m;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnlab::report
