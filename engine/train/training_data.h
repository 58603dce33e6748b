// TrainingData: the datasets of one job — the source of training micro-batches (the built-in
// text's random windows, or a dataset file's packed rows) and the validation rows — and the
// validation sweep that `ferry train --eval-every` and `ferry eval` share.
//
//  - `--data builtin`: TokenStream::Builtin() with the window Batcher (dataset.h), unchanged.
//  - `--data FILE`: LoadExamples (examples.h) with the model's tokenizer and chat template,
//    shuffled by seed, the validation share split off (--val-fraction) or read from --val-data,
//    packed into rows of --seq-len (packed_dataset.h) and drawn by a PackedBatcher.
//
// Ownership: owns everything it hands out (the batch source refers into it: do not move it, hence
// the unique_ptr). Thread-safety: immutable after Load.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/job/job_spec.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/plan/planner.h"
#include "engine/text/tokenizer.h"
#include "engine/train/chat_template.h"
#include "engine/train/dataset.h"
#include "engine/train/examples.h"
#include "engine/train/packed_dataset.h"
#include "kernels/status.h"

namespace ferry {

// The tokenizer of a job's --model: the byte tokenizer for "tiny", else the folder's
// tokenizer.json (LoadTokenizer).
Result<std::unique_ptr<Tokenizer>> ModelTokenizer(const std::string& model);

// The chat template for --chat-template `name` ("auto": detected from the model folder; the tiny
// model uses chatml).
Result<ChatTemplate> ResolveChatTemplate(const std::string& name, const std::string& model);

// A generation prompt in a chat template: one user turn (after a system turn when `system` is
// non-empty) with the assistant's header after it (RenderChatPrompt): the text, its ids (encoded
// without added special tokens: the template writes its own), and the id of the template's end
// of turn when the tokenizer holds it as one token (the stop of the answer).
struct ChatPrompt {
  std::string text;
  std::vector<int32_t> ids;
  std::optional<int32_t> end_of_turn;
};
// The template a chat prompt (generate and tokenize --chat) is rendered in: ResolveChatTemplate,
// "none" refused (it renders no chat); !thinking (--no-thinking) is Qwen3's enable_thinking=False,
// refused for another template.
Result<ChatTemplate> ChatPromptTemplate(const std::string& name, const std::string& model,
                                        bool thinking = true);
// A chat turn read from stdin: `input` without the line end that closed it.
std::string ChatTurnFromInput(std::string input);
// Errors: InvalidArgument for no template (kNone) naming --chat-template; RenderChat's.
Result<ChatPrompt> EncodeChatPrompt(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                    const std::string& system, const std::string& user);

// The pad id for packed rows: the tokenizer's PAD, else its EOS, else 0 (padding is masked).
int32_t PadId(const Tokenizer& tokenizer);

// Reads a dataset file's examples (LoadExamples, read as `reading` says; its tokenizer REQUIRED,
// its vocabulary the model's) and checks their ids against the model's vocabulary; appends
// "FILE: N examples[, K bad lines skipped]" to `log`.
Result<std::vector<Example>> LoadDataset(const std::string& path, const ExampleOptions& reading,
                                         const ModelConfig& model, std::string* log);

// How a job reads its dataset files: the chat template and its data options.
ExampleOptions JobExampleOptions(const JobSpec& job, const Tokenizer& tokenizer,
                                 const ChatTemplate& chat);

// "R rows of T (F% filled, D pieces dropped)" for the log.
std::string DescribeRows(const PackedRows& rows);

// The updates `epochs` passes over `rows` training rows take at `batch_size` rows an update:
// ceil(epochs x rows / batch_size), at least 1. REQUIRES: epochs > 0, rows >= 0, batch_size > 0.
int64_t StepsForEpochs(double epochs, int64_t rows, int64_t batch_size);
// "--epochs 2 of 60 training rows: 15 updates": how `ferry train` and `ferry plan` say it.
std::string EpochsUpdates(double epochs, int64_t rows, int64_t updates);

class TrainingData {
 public:
  // REQUIRES: ValidateJobSpec(job, model) is ok.
  static Result<std::unique_ptr<TrainingData>> Load(const JobSpec& job, const ModelConfig& model);

  const BatchSource& source() const { return *source_; }
  // Rows for validation; null when the job has none.
  const PackedRows* validation() const { return val_ ? &*val_ : nullptr; }
  // One line for the log: what was read, how it packed, what was skipped.
  const std::string& summary() const { return summary_; }
  // The most documents any b rows of the training or validation rows hold, for b in [1, rows]
  // (PackedRows::MostDocuments; the larger of the two): what the job's plan sizes a micro-batch's
  // attention for. Empty for the built-in text (one document per sequence).
  std::vector<int64_t> MostDocuments(int64_t rows) const;
  // What the plan is told: MostDocuments(rows) and the packed rows' host bytes (training and
  // validation; none for the built-in text, whose tokens are part of the program).
  plan::DataCounts Counts(int64_t rows) const;
  // The host memory the packed rows take, training and validation (PackedRows::host_bytes): what
  // a plan counts as data.rows.
  uint64_t host_bytes() const;
  // The packed training rows of a dataset file (what an epoch visits); 0 for the built-in text.
  int64_t training_rows() const { return train_ ? train_->rows() : 0; }

 private:
  TrainingData() = default;
  std::optional<TokenStream> stream_;
  std::optional<PackedRows> train_, val_;
  std::unique_ptr<BatchSource> source_;
  std::string summary_;
};

// Mean loss over rows of a PackedRows, micro-batch by micro-batch in order.
struct EvalResult {
  double loss_sum = 0;  // sum of -log p over the targets
  int64_t targets = 0;  // targets scored
  int64_t micro_batches = 0;

  double mean_loss() const { return targets > 0 ? loss_sum / double(targets) : 0.0; }
  double perplexity() const;
};

// Forward-only (ModelRunner::EvaluateLoss) over rows [0, rows) in micro-batches of `batch` rows
// (the runner's B; the last is padded), at most `max_batches` of them (0: all). REQUIRES: the
// runner's shape is batch x rows.seq_len().
Result<EvalResult> EvaluateRows(ModelRunner& runner, const PackedRows& rows, int64_t batch,
                                int64_t max_batches);

}  // namespace ferry
