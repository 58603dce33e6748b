#include "engine/train/training_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/train/examples.h"

namespace ferry {

Result<std::unique_ptr<Tokenizer>> ModelTokenizer(const std::string& model) {
  if (model == "tiny") return MakeByteTokenizer();
  return LoadTokenizer(model);
}

Result<ChatTemplate> ResolveChatTemplate(const std::string& name, const std::string& model) {
  if (name != "auto") {
    FERRY_ASSIGN_OR_RETURN(ChatFormat f, ParseChatFormat(name));
    ChatTemplate t;
    t.format = f;
    if (f == ChatFormat::kQwen3) t.tool_use = ToolUse::kQwen;  // the release template's
    return t;
  }
  if (model == "tiny") {
    ChatTemplate t;
    t.format = ChatFormat::kChatMl;
    return t;
  }
  return DetectChatTemplate(model);
}

Result<ChatTemplate> ChatPromptTemplate(const std::string& name, const std::string& model,
                                        bool thinking) {
  if (name == "none") {
    return Status::InvalidArgument("--chat-template none renders no chat: leave out --chat");
  }
  FERRY_ASSIGN_OR_RETURN(ChatTemplate t, ResolveChatTemplate(name, model));
  if (!thinking && t.format != ChatFormat::kQwen3) {
    return Status::InvalidArgument(std::string("--no-thinking is for Qwen3's template (it ends the "
                                               "prompt with an empty <think> block); this chat "
                                               "template is ") +
                                   ChatFormatName(t.format));
  }
  t.enable_thinking = thinking;
  return t;
}

std::string ChatTurnFromInput(std::string input) {
  if (!input.empty() && input.back() == '\n') input.pop_back();
  if (!input.empty() && input.back() == '\r') input.pop_back();
  return input;
}

Result<ChatPrompt> EncodeChatPrompt(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                    const std::string& system, const std::string& user) {
  if (chat.format == ChatFormat::kNone) {
    return Status::InvalidArgument(
        "the model has no chat template ferry knows (its tokenizer_config.json names none it "
        "renders, nor does its model type); pass --chat-template " +
        ChatFormatNames("|", /*with_none=*/false));
  }
  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({.role = "system", .content = system});
  messages.push_back({.role = "user", .content = user});
  ChatPrompt p;
  FERRY_ASSIGN_OR_RETURN(p.text, RenderChatPrompt(chat, messages));
  p.ids = tokenizer.Encode(p.text, /*add_special_tokens=*/false);
  const std::vector<int32_t> end =
      tokenizer.Encode(std::string(EndOfTurn(chat.format)), /*add_special_tokens=*/false);
  if (end.size() == 1) p.end_of_turn = end[0];
  return p;
}

int32_t PadId(const Tokenizer& tokenizer) {
  const SpecialTokenIds s = tokenizer.special_ids();
  return s.pad.value_or(s.eos.value_or(0));
}

ExampleOptions JobExampleOptions(const JobSpec& job, const Tokenizer& tokenizer,
                                 const ChatTemplate& chat) {
  return {.tokenizer = &tokenizer,
          .chat_template = chat,
          .skip_bad_lines = job.skip_bad_lines,
          .train_on_prompt = job.train_on_prompt};
}

Result<std::vector<Example>> LoadDataset(const std::string& path, const ExampleOptions& reading,
                                         const ModelConfig& model, std::string* log) {
  ExampleOptions o = reading;
  o.vocab_size = model.vocab_size;
  FERRY_ASSIGN_OR_RETURN(LoadedExamples loaded, LoadExamples(path, o));
  for (size_t i = 0; i < loaded.examples.size(); ++i) {
    for (int32_t id : loaded.examples[i].tokens) {
      if (id < 0 || id >= model.vocab_size) {
        return Status::InvalidArgument(path + ": example " + std::to_string(i) + " has token id " +
                                       std::to_string(id) + ", outside the model's vocabulary of " +
                                       std::to_string(model.vocab_size) +
                                       "; is the tokenizer the model's?");
      }
    }
  }
  if (log != nullptr) {
    *log += path + ": " + std::to_string(loaded.examples.size()) +
            (loaded.examples.size() == 1 ? " example" : " examples");
    if (loaded.skipped_lines > 0) *log += ", " + SkippedText(loaded);
    if (std::string note = UnusedTrainOnPrompt(loaded, o); !note.empty()) {
      *log += " (" + note + ")";
    }
  }
  return std::move(loaded.examples);
}

std::string DescribeRows(const PackedRows& rows) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%lld rows of %lld (%.0f%% filled, %lld pieces dropped)",
                (long long)rows.rows(), (long long)rows.seq_len(), 100 * rows.fill(),
                (long long)rows.dropped_pieces());
  return buf;
}

Result<std::unique_ptr<TrainingData>> TrainingData::Load(const JobSpec& job,
                                                         const ModelConfig& model) {
  std::unique_ptr<TrainingData> d(new TrainingData());
  const int64_t B = job.micro_batch_size();
  if (job.data == "builtin") {
    d->stream_ = TokenStream::Builtin();
    FERRY_ASSIGN_OR_RETURN(Batcher b, Batcher::Create(&*d->stream_, B, job.seq_len, job.seed));
    d->source_ = std::make_unique<Batcher>(b);
    d->summary_ = "built-in text, " + std::to_string(d->stream_->tokens().size()) + " tokens";
    if (job.train_on_prompt) d->summary_ += " (" + std::string(kTrainOnPromptChangesNothing) + ")";
    return d;
  }
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, ModelTokenizer(job.model));
  FERRY_ASSIGN_OR_RETURN(ChatTemplate chat, ResolveChatTemplate(job.chat_template, job.model));
  FERRY_ASSIGN_OR_RETURN(LongExamples mode, ParseLongExamples(job.long_examples));
  std::string log;
  const ExampleOptions reading = JobExampleOptions(job, *tok, chat);
  FERRY_ASSIGN_OR_RETURN(std::vector<Example> examples,
                         LoadDataset(job.data, reading, model, &log));
  examples = ShuffleExamples(std::move(examples), job.seed);
  std::vector<Example> val;
  if (job.val_fraction > 0) {
    val = SplitValidation(examples, job.val_fraction);
    log += " (" + std::to_string(val.size()) + " held out for validation)";
  } else if (!job.val_data.empty()) {
    log += "; ";
    FERRY_ASSIGN_OR_RETURN(val, LoadDataset(job.val_data, reading, model, &log));
  }
  const int32_t pad = PadId(*tok);
  d->train_ = PackedRows::Pack(examples, job.seq_len, mode, pad);
  log += "; training: " + DescribeRows(*d->train_);
  if (!val.empty()) {
    d->val_ = PackedRows::Pack(val, job.seq_len, mode, pad);
    log += "; validation: " + DescribeRows(*d->val_);
    if (d->val_->rows() == 0) {
      return Status::InvalidArgument("the validation set has no target to score (" + log + ")");
    }
  }
  if (job.eval_every > 0 && !d->val_) {
    return Status::InvalidArgument("--eval-every: the validation set is empty (" + log +
                                   "); give more examples or --val-data FILE");
  }
  FERRY_ASSIGN_OR_RETURN(PackedBatcher b,
                         PackedBatcher::Create(&*d->train_, B, job.micro_batches, job.seed));
  d->source_ = std::make_unique<PackedBatcher>(b);
  d->summary_ = std::move(log);
  return d;
}

int64_t StepsForEpochs(double epochs, int64_t rows, int64_t batch_size) {
  // Rounded up to whole updates, less a hair so that 2 epochs of 64 rows in batches of 16 are 8
  // updates, not 9 after a rounding error.
  const double updates = epochs * double(rows) / double(batch_size);
  return std::max<int64_t>(1, int64_t(std::ceil(updates * (1 - 1e-12))));
}

std::string EpochsUpdates(double epochs, int64_t rows, int64_t updates) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "--epochs %g of %lld training rows: %lld updates", epochs,
                (long long)rows, (long long)updates);
  return buf;
}

plan::DataCounts TrainingData::Counts(int64_t rows) const {
  return {.documents_in_rows = MostDocuments(rows), .host_bytes = host_bytes()};
}

uint64_t TrainingData::host_bytes() const {
  return (val_ ? val_->host_bytes() : 0) + (train_ ? train_->host_bytes() : 0);
}

std::vector<int64_t> TrainingData::MostDocuments(int64_t rows) const {
  std::vector<int64_t> most;
  for (const std::optional<PackedRows>* p : {&train_, &val_}) {
    if (!p->has_value()) continue;
    const std::vector<int64_t> m = (*p)->MostDocuments(rows);
    if (most.empty()) most.assign(m.size(), 0);
    for (size_t b = 0; b < m.size(); ++b) most[b] = std::max(most[b], m[b]);
  }
  return most;
}

double EvalResult::perplexity() const { return std::exp(mean_loss()); }

Result<EvalResult> EvaluateRows(ModelRunner& runner, const PackedRows& rows, int64_t batch,
                                int64_t max_batches) {
  EvalResult r;
  for (int64_t first = 0; first < rows.rows(); first += batch) {
    if (max_batches > 0 && r.micro_batches >= max_batches) break;
    const MicroBatch mb = SequentialMicroBatch(rows, first, batch);
    ++r.micro_batches;
    if (mb.valid_targets == 0) continue;
    FERRY_ASSIGN_OR_RETURN(double sum, runner.EvaluateLoss(RunnerInput(mb, 1.0)));
    r.loss_sum += sum;
    r.targets += mb.valid_targets;
  }
  return r;
}

}  // namespace ferry
