// `ferry generate` and `ferry eval` on Hugging Face model folders, as a user runs them: a tiny
// sharded bf16 Llama folder with a byte-level BPE tokenizer.json, a LoRA run trained on it (used
// as --model and as --adapter), and bad folders. The CLI's results are checked against the same
// weights run in-process (Generator, the reference runner), loaded from the folder by
// LoadModelFolder (whose round trip model_folder_test checks against the weights written).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/exec/planned_generator.h"
#include "engine/json.h"
#include "engine/model/model_folder.h"
#include "engine/testing/golden_files.h"
#include "engine/testing/reference_runner.h"
#include "engine/testing/tiny_models.h"
#include "engine/testing/tokenizer_json.h"
#include "engine/text/tokenizer.h"
#include "engine/train/run_training.h"
#include "engine/train/training_data.h"
#include "kernels/cpu/cpu_device.h"
#include "tests/cli_testing.h"

namespace ferry {
namespace {

using json = nlohmann::json;
using testing::CommandResult;
using testing::Ferry;

constexpr int kThreads = 2;
const char* const kPrompt = "hello world";

// The tokenizer.json of the test folders: byte-level BPE, 262 tokens (engine/testing).
std::string TokenizerJson() { return testing::ByteLevelTokenizerJson().dump(); }

// The generated text of a `ferry generate` run: its output less the speed line on stderr.
CommandResult Generate(const std::string& args) {
  return testing::GeneratedText(Ferry("generate " + args + " --prompt '" + kPrompt +
                                      "' --max-tokens 12 --temperature 0 --threads " +
                                      std::to_string(kThreads)));
}

// `ferry eval --json` on `data`: the loss it reports (NaN when it failed).
double EvalLoss(const std::string& args, const std::string& data) {
  CommandResult r =
      Ferry("eval " + args + " --data " + data + " --seq-len 16 --batch-size 2 --json --threads " +
            std::to_string(kThreads));
  EXPECT_EQ(r.code, 0) << r.output;
  const json j = json::parse(r.output, nullptr, false);
  if (r.code != 0 || !j.is_object() || !j.contains("loss")) return NAN;
  return j["loss"].get<double>();
}

class ModelFolderCliTest : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    src_ = dir_ + "/src";
    WriteFolder(src_, 300);
    data_ = dir_ + "/data.jsonl";
    std::ofstream(data_) << R"({"text": "hello world, hello well"})"
                         << "\n"
                         << R"({"prompt": "who? ", "completion": "the world"})"
                         << "\n";
  }

  // A tiny Llama (vocabulary `vocab`; GPT-2 with `gpt2`) as sharded bf16 safetensors, with the
  // tokenizer.json.
  void WriteFolder(const std::string& dir, int64_t vocab, bool gpt2 = false) {
    const std::string v = std::to_string(vocab);
    Result<ModelConfig> c = ParseHfConfig(
        gpt2 ? R"({"model_type": "gpt2", "vocab_size": )" + v +
                   R"(, "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 64,
                      "torch_dtype": "bfloat16"})"
             : R"({"model_type": "llama", "vocab_size": )" + v +
                   R"(, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "num_key_value_heads": 1,
                      "max_position_embeddings": 64, "torch_dtype": "bfloat16"})");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, {});
    ASSERT_TRUE(WriteModelFolder(dir, *c, layers, testing::TinyWeights(layers, 7),
                                 {.dtype = DType::kBF16, .max_shard_bytes = 8192})
                    .ok());
    ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
    std::ofstream(dir + "/tokenizer.json") << TokenizerJson();
  }

  // What `ferry generate` prints for the model loaded in-process (`quantize`: --quantize) with
  // the folder's tokenizer: greedy, same limits; with `chat`, the prompt a user turn of it (after
  // `system`'s turn when non-empty) as EncodeChatPrompt writes it, stopping at its end of turn.
  std::string ExpectedText(const std::string& dir, const std::string& adapter,
                           BaseQuant quantize = BaseQuant::kNone,
                           const ChatTemplate* chat = nullptr, const std::string& system = "") {
    Result<LoadedModel> m = LoadModelFolder(dir, adapter, quantize);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    Result<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(dir);
    EXPECT_TRUE(tok.ok()) << tok.status().ToString();
    if (!m.ok() || !tok.ok()) return "";
    std::vector<int32_t> ids = (*tok)->Encode(kPrompt, true);
    GenerateOptions o;
    if (std::optional<int32_t> eos = (*tok)->special_ids().eos) o.stop_ids = {*eos};
    if (chat != nullptr) {
      Result<ChatPrompt> p = EncodeChatPrompt(**tok, *chat, system, kPrompt);
      EXPECT_TRUE(p.ok() && p->end_of_turn) << p.status().ToString();
      if (!p.ok() || !p->end_of_turn) return "";
      ids = p->ids;
      o.stop_ids.push_back(*p->end_of_turn);
    }
    Result<std::unique_ptr<CpuDevice>> device =
        CpuDevice::Create({.memory_bytes = size_t(64) << 20, .compute_threads = kThreads});
    EXPECT_TRUE(device.ok());
    if (!device.ok()) return "";
    const int64_t positions = int64_t(ids.size()) + 12;
    const plan::Plan p =
        exec::GenerationPlan(m->config, m->lora, {}, 1, positions, int64_t(ids.size()), 1,
                             {.cuda = false, .cpu_threads = kThreads});
    Result<std::unique_ptr<exec::PlannedGenerator>> gen =
        exec::CreatePlannedGenerator({device->get()}, m->config, p, m->weights);
    EXPECT_TRUE(gen.ok()) << gen.status().ToString();
    if (!gen.ok()) return "";
    o.max_new_tokens = 12;
    o.sampling.temperature = 0;
    Result<std::vector<int32_t>> out =
        ferry::Generate(**gen, ids, o, [](int32_t) { return Status::Ok(); });
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? (*tok)->Decode(*out, true) + "\n" : "";
  }

  // The mean loss of data_ under the model loaded in-process (as ExpectedText), on a
  // training-capable runner.
  double ExpectedLoss(const std::string& dir, const std::string& adapter,
                      BaseQuant quantize = BaseQuant::kNone, bool double_quant = true) {
    Result<LoadedModel> m = LoadModelFolder(dir, adapter, quantize, double_quant);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    // The folder's tokenizer as the CLI loads it (config.json's BOS/EOS ids included).
    Result<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(dir);
    if (!m.ok() || !tok.ok()) return NAN;
    Result<ChatTemplate> chat = ResolveChatTemplate("auto", dir);
    EXPECT_TRUE(chat.ok()) << chat.status().ToString();
    Result<std::vector<Example>> examples =
        LoadDataset(data_, {.tokenizer = tok->get(), .chat_template = *chat}, m->config, nullptr);
    EXPECT_TRUE(examples.ok()) << examples.status().ToString();
    if (!chat.ok() || !examples.ok()) return NAN;
    const PackedRows rows = PackedRows::Pack(*examples, 16, LongExamples::kSplit, PadId(**tok));
    ReferenceRunnerOptions ro;
    ro.shape = {2, 16};
    Result<std::unique_ptr<CpuDevice>> device =
        CpuDevice::Create({.memory_bytes = size_t(256) << 20,  // a cap: the arena is mapped
                           .compute_threads = kThreads});
    Result<std::unique_ptr<ModelRunner>> runner =
        CreateReferenceRunner(**device, m->config, m->lora, ro);
    EXPECT_TRUE(runner.ok()) << runner.status().ToString();
    if (!runner.ok() || !(*runner)->UploadWeights(m->weights).ok()) return NAN;
    Result<EvalResult> r = EvaluateRows(**runner, rows, 2, 0);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->mean_loss() : NAN;
  }

  // Trains a LoRA run on src_ for two steps; returns its folder.
  std::string TrainLora() {
    const std::string run = dir_ + "/run";
    CommandResult r = Ferry("train --model " + src_ + " --data " + data_ +
                            " --steps 2 --batch-size 2 --seq-len 16 --lr 0.05 --lora-rank 2 "
                            "--threads 2 --out " +
                            run);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_FALSE(std::filesystem::exists(run + "/model.safetensors"));
    // The run's last line says how to make one model folder of it.
    EXPECT_NE(r.output.find("`ferry merge --model " + run + " --out DIR`"), std::string::npos)
        << r.output;
    return run;
  }

  std::string src_, data_;
};

// Same weights, same tokenizer, same arithmetic: the CLI's greedy text and loss equal the
// in-process ones exactly (the eval runner differs only in having no gradient buffers).
TEST_F(ModelFolderCliTest, GenerateAndEvalOnAShardedBf16Folder) {
  WriteFolder(dir_ + "/gpt2", 300, /*gpt2=*/true);  // Conv1D weights stored transposed
  for (const std::string& dir : {src_, dir_ + "/gpt2"}) {
    CommandResult g = Generate("--model " + dir);
    ASSERT_EQ(g.code, 0) << dir << ": " << g.output;
    EXPECT_EQ(g.output, ExpectedText(dir, "")) << dir;
    EXPECT_GT(g.output.size(), 4u) << "12 greedy tokens (no EOS in this vocabulary's draws)";
    const double loss = EvalLoss("--model " + dir, data_);
    EXPECT_EQ(loss, ExpectedLoss(dir, "")) << dir;
    EXPECT_GT(loss, 0) << dir;
  }
}

// A tokenizer.json small enough for tests/goldens/llama_bnb4's vocabulary of 97: BPE over the
// lowercase letters and "▁" (a space), no merges, anything else <unk>; 30 tokens.
std::string LetterTokenizerJson() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\u2581", 3}};
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = 4 + (c - 'a');
  const json space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  const json unspace = {{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}};
  return json{
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
      {"normalizer", space},
      {"pre_tokenizer", nullptr},
      {"decoder", unspace},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"vocab", vocab}, {"merges", json::array()}}}}
      .dump();
}

// generate --chat: the prompt as a user turn of the folder's chat template (detected from its
// tokenizer_config.json) with the assistant's header after it, the answer stopping at the end of
// the turn: the greedy text of those ids in-process, with and without --system. Refused: a
// folder without a template, a tokenizer without the end-of-turn token (the tiny model's bytes),
// --system without --chat.
TEST_F(ModelFolderCliTest, GenerateChatPromptsInTheTemplate) {
  const std::string dir = dir_ + "/chat";
  WriteFolder(dir, 300);
  json tok = testing::ByteLevelTokenizerJson();
  for (const auto& [id, text] : {std::pair{262, "<|im_start|>"}, {263, "<|im_end|>"}}) {
    json added = tok["added_tokens"][0];
    added["id"] = id;
    added["content"] = text;
    tok["added_tokens"].push_back(added);
  }
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  std::ofstream(dir + "/tokenizer_config.json")
      << json{{"chat_template",
               "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}}
             .dump();
  const ChatTemplate chatml{.format = ChatFormat::kChatMl};
  CommandResult g = Generate("--model " + dir + " --chat");
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_EQ(g.output, ExpectedText(dir, "", BaseQuant::kNone, &chatml));
  g = Generate("--model " + dir + " --chat --system 'Answer briefly.'");
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_EQ(g.output, ExpectedText(dir, "", BaseQuant::kNone, &chatml, "Answer briefly."));

  CommandResult r =
      Ferry("generate --model " + src_ + " --chat --prompt hi --max-tokens 8");  // no template
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--chat-template"), std::string::npos) << r.output;
  r = Ferry("generate --chat --prompt hi");  // tiny: chatml, in bytes
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("no token for the chat template's end of turn <|im_end|>"),
            std::string::npos)
      << r.output;
  r = Ferry("generate --model " + dir + " --system hi --prompt hi");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("give --chat too"), std::string::npos) << r.output;
  r = Ferry("generate --model " + dir + " --chat --chat-template none --prompt hi");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--chat-template none renders no chat"), std::string::npos) << r.output;
  r = Ferry("tokenize --model " + dir + " --chat --data " + data_);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("give one of them"), std::string::npos) << r.output;

  // `ferry tokenize --chat` shows the same prompt: its ids, and with --jsonl the text and the stop.
  Result<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  Result<ChatPrompt> want = EncodeChatPrompt(**tokenizer, chatml, "Be brief.", kPrompt);
  ASSERT_TRUE(want.ok() && want->end_of_turn == 263) << want.status().ToString();
  std::string ids;
  for (int32_t id : want->ids) ids += (ids.empty() ? "" : " ") + std::to_string(id);
  const std::string out = dir_ + "/chat.ids";
  r = Ferry("tokenize --model " + dir + " --chat --system 'Be brief.' --text '" + kPrompt + "'", "",
            out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(testing::ReadTextFile(out), ids + "\n");
  // From stdin the line end that closes the input is not part of the turn, as for generate.
  std::ofstream(dir_ + "/prompt.txt") << kPrompt << "\n";
  r = Ferry("tokenize --model " + dir + " --chat --system 'Be brief.' < " + dir_ + "/prompt.txt",
            "", out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(testing::ReadTextFile(out), ids + "\n");
  std::ofstream(dir_ + "/chat.jsonl") << json{{"user", kPrompt}, {"system", "Be brief."}}.dump();
  r = Ferry("tokenize --model " + dir + " --chat --jsonl < " + dir_ + "/chat.jsonl", "", out);
  ASSERT_EQ(r.code, 0) << r.output;
  const json line = json::parse(testing::ReadTextFile(out));
  EXPECT_EQ(line["text"], want->text);
  EXPECT_EQ(line["ids"], want->ids);
  EXPECT_EQ(line["end_of_turn"], 263);

  // --no-thinking is Qwen3's enable_thinking=False: an empty <think> block ends the prompt (a
  // system and a user turn render in Qwen3's template as in ChatML); another template refuses
  // it, and it needs --chat.
  r = Ferry("tokenize --model " + dir + " --chat --chat-template qwen3 --no-thinking --jsonl < " +
                dir_ + "/chat.jsonl",
            "", out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(json::parse(testing::ReadTextFile(out))["text"],
            want->text + "<think>\n\n</think>\n\n");
  const ChatTemplate qwen3{.format = ChatFormat::kQwen3, .enable_thinking = false};
  g = Generate("--model " + dir + " --chat --chat-template qwen3 --no-thinking");
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_EQ(g.output, ExpectedText(dir, "", BaseQuant::kNone, &qwen3));
  for (const std::string& args :
       {"tokenize --model " + dir + " --chat --no-thinking --text hi",
        "generate --model " + dir + " --chat --no-thinking --prompt hi --max-tokens 4",
        // A template named on the command line is checked before anything else (the default
        // --max-tokens is more than this model's positions).
        "generate --model " + dir + " --chat --chat-template chatml --no-thinking --prompt hi"}) {
    r = Ferry(args);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("--no-thinking is for Qwen3's template"), std::string::npos)
        << r.output;
  }
  r = Ferry("generate --model " + dir + " --no-thinking --prompt hi");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("give --chat too"), std::string::npos) << r.output;
}

// A folder pre-quantized by transformers + bitsandbytes (tests/goldens/llama_bnb4, with a
// tokenizer.json added): generate and eval run its NF4 base as it is, with and without a PEFT
// adapter on top, and equal the in-process Generator and the reference runner over
// LoadModelFolder's NF4 weights exactly.
TEST_F(ModelFolderCliTest, GenerateAndEvalOnAPreQuantizedFolder) {
  namespace fs = std::filesystem;
  const std::string golden = testing::SourceDir() + "/tests/goldens/llama_bnb4";
  const std::string dir = dir_ + "/bnb4";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy(golden + "/" + f, dir);
  std::ofstream(dir + "/tokenizer.json") << LetterTokenizerJson();
  const std::string adapter = testing::SourceDir() + "/tests/goldens/llama_qlora";
  for (const std::string& with : {std::string(), adapter}) {
    const std::string args = "--model " + dir + (with.empty() ? "" : " --adapter " + with);
    CommandResult g = Generate(args);
    ASSERT_EQ(g.code, 0) << args << ": " << g.output;
    EXPECT_EQ(g.output, ExpectedText(dir, with)) << args;
    const double loss = EvalLoss(args, data_);
    EXPECT_EQ(loss, ExpectedLoss(dir, with)) << args;
    EXPECT_GT(loss, 0) << args;
  }
}

// --quantize nf4 on an unquantized folder: the base quantized as it is packed, as QLoRA holds it.
// The CLI equals the in-process NF4 model exactly and the fp32 model nearly (4-bit weights move the
// loss a little, not to another model's); a GPT-2 model is one line naming it.
TEST_F(ModelFolderCliTest, QuantizeOnLoad) {
  const std::string args = "--model " + src_ + " --quantize nf4";
  CommandResult g = Generate(args);
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_EQ(g.output, ExpectedText(src_, "", BaseQuant::kNf4));
  const double nf4 = EvalLoss(args, data_);
  EXPECT_EQ(nf4, ExpectedLoss(src_, "", BaseQuant::kNf4));
  const double fp32 = ExpectedLoss(src_, "");
  EXPECT_NE(nf4, fp32) << "the base was not quantized";
  EXPECT_NEAR(nf4, fp32, 0.05 * fp32);
  // --no-double-quant: absmax kept in fp32, so slightly different dequantized weights.
  const double flat = EvalLoss(args + " --no-double-quant", data_);
  EXPECT_EQ(flat, ExpectedLoss(src_, "", BaseQuant::kNf4, /*double_quant=*/false));
  EXPECT_NE(flat, nf4) << "--no-double-quant was not applied";

  WriteFolder(dir_ + "/gpt2", 300, /*gpt2=*/true);
  for (const std::string& command :
       {std::string("generate --prompt hi --max-tokens 4"), "eval --seq-len 16 --data " + data_}) {
    CommandResult r = Ferry(command + " --model " + dir_ + "/gpt2 --quantize nf4");
    EXPECT_EQ(r.code, 1) << command << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("GPT-2"), std::string::npos) << r.output;
  }
}

TEST_F(ModelFolderCliTest, LoraRunFolderAndAdapter) {
  const std::string run = TrainLora();
  const std::string expected = ExpectedText(src_, run);
  EXPECT_NE(expected, ExpectedText(src_, "")) << "the trained adapter changes the greedy text";
  // The run folder finds its base through job.json; --adapter puts it on the base explicitly.
  for (const std::string& args : {"--model " + run, "--model " + src_ + " --adapter " + run}) {
    CommandResult g = Generate(args);
    ASSERT_EQ(g.code, 0) << args << ": " << g.output;
    EXPECT_EQ(g.output, expected) << args;
  }
  const double with_adapter = ExpectedLoss(src_, run);
  EXPECT_EQ(EvalLoss("--model " + run, data_), with_adapter);
  EXPECT_EQ(EvalLoss("--model " + src_ + " --adapter " + run, data_), with_adapter);
  // Trained on this data at a high rate, the adapter lowered its loss.
  EXPECT_LT(with_adapter, ExpectedLoss(src_, ""));
}

// rsLoRA scales the adapter by alpha / sqrt(rank): rank 4 with alpha 8 trains what alpha 16
// without it trains (both scale by 4), to the bit; the adapter says use_rslora, and eval (on the
// run folder or through --adapter, as PEFT would load it) and merge honour it.
TEST_F(ModelFolderCliTest, RsLoraScalesByTheRootOfTheRank) {
  const std::string job = "train --model " + src_ + " --data " + data_ +
                          " --steps 2 --batch-size 2 --seq-len 16 --lr 0.05 --lora-rank 4 "
                          "--threads 2 --out ";
  const std::string plain = dir_ + "/plain", rs = dir_ + "/rs";
  CommandResult r = Ferry(job + plain + " --lora-alpha 16");
  ASSERT_EQ(r.code, 0) << r.output;
  r = Ferry(job + rs + " --lora-alpha 8 --lora-rslora");
  ASSERT_EQ(r.code, 0) << r.output;
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(rs + "/adapter_model.safetensors"), bytes(plain + "/adapter_model.safetensors"));
  const json config = json::parse(bytes(rs + "/adapter_config.json"));
  EXPECT_EQ(config["use_rslora"], true);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(json::parse(bytes(plain + "/adapter_config.json"))["use_rslora"], false);
  const double loss = ExpectedLoss(src_, plain);
  EXPECT_EQ(ExpectedLoss(src_, rs), loss);
  EXPECT_EQ(EvalLoss("--model " + rs, data_), loss);
  EXPECT_EQ(EvalLoss("--model " + src_ + " --adapter " + rs, data_), loss);
  r = Ferry("merge --model " + rs + " --dtype f32 --out " + dir_ + "/merged");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NEAR(EvalLoss("--model " + dir_ + "/merged", data_), loss, 1e-5 * loss);
}

// `ferry merge`: the run's adapter merged into its base is one plain model folder that computes
// what base and adapter computed together (f32: to rounding; the base's bf16 by default: to its
// rounding), sharded as asked; refusals are one line and write nothing.
TEST_F(ModelFolderCliTest, MergeWritesOneFolderThatComputesWhatBaseAndAdapterDid) {
  namespace fs = std::filesystem;
  const std::string run = TrainLora();
  const double with_adapter = ExpectedLoss(src_, run);
  {  // A field ferry does not read, which the merged config.json keeps.
    std::ifstream in(src_ + "/config.json");
    json config = json::parse(in);
    config["bos_token_id"] = 7;
    std::ofstream(src_ + "/config.json") << config.dump(2);
  }
  // What a killed merge left beside --out (its process is gone) is removed by the next one.
  const std::string stale = dir_ + "/.merged.merging-999999999";
  fs::create_directories(stale);
  const std::string merged = dir_ + "/merged";
  CommandResult r = Ferry("merge --model " + run + " --out " + merged + "/ --dtype f32");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(stale));
  {
    std::ifstream in(merged + "/config.json");
    const json config = json::parse(in);
    EXPECT_EQ(config.value("bos_token_id", 0), 7);
    EXPECT_EQ(config.value("torch_dtype", ""), "float32");
  }
  // Every projection of both blocks (q, k, v, o, gate, up, down).
  EXPECT_NE(r.output.find("merged 14 adapted projections (rank 2"), std::string::npos) << r.output;
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(merged + "/" + file)) << file;
  }
  EXPECT_FALSE(fs::exists(merged + "/adapter_config.json"));
  EXPECT_NEAR(EvalLoss("--model " + merged, data_), with_adapter, 1e-5 * with_adapter);
  EXPECT_NE(ExpectedLoss(merged, ""), ExpectedLoss(src_, "")) << "the merge changed nothing";

  const std::string bf16 = dir_ + "/merged-bf16";
  CommandResult b = Ferry("merge --model " + src_ + " --adapter " + run + " --out " + bf16 +
                          " --max-shard-size 8KiB");
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_TRUE(fs::exists(bf16 + "/model.safetensors.index.json"));
  Result<ModelConfig> c = LoadHfConfig(bf16 + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->weights_dtype, DType::kBF16);
  EXPECT_NEAR(EvalLoss("--model " + bf16, data_), with_adapter, 1e-2 * with_adapter);

  // --quantize nf4: into the base the adapter would have been trained over in QLoRA.
  const std::string nf4 = dir_ + "/merged-nf4";
  CommandResult q = Ferry("merge --model " + run + " --quantize nf4 --dtype f32 --out " + nf4);
  ASSERT_EQ(q.code, 0) << q.output;
  const double nf4_loss = ExpectedLoss(src_, run, BaseQuant::kNf4);
  EXPECT_NEAR(EvalLoss("--model " + nf4, data_), nf4_loss, 1e-5 * nf4_loss);

  const auto merged_size = fs::file_size(merged + "/model.safetensors");
  const struct {
    std::string args, says;
  } refused[] = {
      {"--model " + src_ + " --out " + dir_ + "/none", "no LoRA adapter"},
      {"--model " + run + " --out " + merged, "not an empty folder"},
      {"--model " + run + " --out " + dir_ + "/i32 --dtype i32", "f32, bf16 or f16"},
      {"--model " + run + " --out " + dir_ + "/bad --max-shard-size lots", "--max-shard-size: "},
      {"--model " + run + " --out " + dir_ + "/link", "symbolic link"},
  };
  fs::create_directories(dir_ + "/target");
  fs::create_directory_symlink(dir_ + "/target", dir_ + "/link");
  for (const auto& c : refused) {
    CommandResult e = Ferry("merge " + c.args);
    EXPECT_EQ(e.code, 1) << c.args << ": " << e.output;
    EXPECT_EQ(e.output.find('\n'), e.output.size() - 1) << c.args << ": " << e.output;
    EXPECT_NE(e.output.find(c.says), std::string::npos) << c.args << ": " << e.output;
  }
  for (const char* gone : {"/none", "/i32", "/bad"}) EXPECT_FALSE(fs::exists(dir_ + gone)) << gone;
  // A folder pre-quantized by bitsandbytes merges into a plain one: no quantization_config.
  const std::string bnb = dir_ + "/merged-bnb";
  CommandResult n = Ferry("merge --model " + testing::GoldenPath("llama_bnb4", "") + " --adapter " +
                          testing::GoldenPath("llama_qlora", "") + " --out " + bnb);
  ASSERT_EQ(n.code, 0) << n.output;
  {
    std::ifstream in(bnb + "/config.json");
    const json config = json::parse(in);
    EXPECT_FALSE(config.contains("quantization_config")) << config.dump();
    EXPECT_TRUE(config.contains("architectures")) << config.dump();
  }
  EXPECT_EQ(fs::file_size(merged + "/model.safetensors"), merged_size);
  EXPECT_TRUE(fs::is_empty(dir_ + "/target"));
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".merging-"), std::string::npos) << e.path();
  }
}

TEST_F(ModelFolderCliTest, BadFoldersAreOneLineErrors) {
  namespace fs = std::filesystem;
  const std::string run = TrainLora();
  fs::create_directories(dir_ + "/empty");
  WriteFolder(dir_ + "/small", 200);  // a vocabulary smaller than the tokenizer's 262 tokens
  fs::copy(src_, dir_ + "/noweights", fs::copy_options::recursive);
  fs::remove(dir_ + "/noweights/model.safetensors.index.json");
  const struct {
    std::string args, says;
  } cases[] = {
      {"--model " + dir_ + "/empty", "config.json"},
      {"--model " + dir_ + "/nowhere", "nowhere"},
      {"--model " + dir_ + "/noweights", "model.safetensors"},
      {"--model " + src_ + " --adapter " + dir_ + "/empty", "adapter_config.json"},
      {"--model " + dir_ + "/small", "different models"},
      {"--model tiny --adapter " + run, "--adapter"},
  };
  for (const auto& c : cases) {
    for (const char* cmd : {"generate", "eval"}) {
      const std::string args = std::string(cmd) + " " + c.args + " --prompt x --data " + data_;
      CommandResult r =
          // Within the folder's 64 positions, so the folder's own problem is what is reported.
          Ferry(std::string(cmd) == "generate"
                    ? "generate " + c.args + " --prompt x --max-tokens 8"
                    : "eval " + c.args + " --seq-len 32 --data " + data_);
      EXPECT_EQ(r.code, 1) << args << ": " << r.output;
      EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << args << ": " << r.output;
      EXPECT_NE(r.output.find(c.says), std::string::npos) << args << ": " << r.output;
    }
  }
  // A LoRA run whose base has moved names the base and the way out.
  fs::rename(src_, dir_ + "/moved");
  CommandResult r = Ferry("generate --model " + run + " --prompt x");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--adapter " + run), std::string::npos) << r.output;
}

TEST_F(ModelFolderCliTest, PlanReadsTheFolder) {
  for (const std::string& model : {src_, src_ + "/config.json"}) {
    CommandResult r = Ferry("plan --model " + model +
                            " --hardware 1x-rtx4090-pcie4 --seq-len 16 --batch-size 2 --json");
    EXPECT_EQ(r.code, 0) << model << ": " << r.output;
  }
  CommandResult r = Ferry("plan --model " + dir_ + " --hardware 1x-rtx4090-pcie4");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("config.json"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ferry
