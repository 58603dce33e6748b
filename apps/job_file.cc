#include "apps/job_file.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "apps/cli_suggestions.h"

namespace ferry {
namespace {

bool IsMarker(const CLI::ConfigItem& item) { return item.name == "--" || item.name == "++"; }

// Key items (not section markers) CLI11's TOML reader finds in `text`.
size_t KeyItems(const std::string& text) {
  std::istringstream in(text);
  size_t n = 0;
  for (const CLI::ConfigItem& item : CLI::ConfigTOML().from_config(in)) n += IsMarker(item) ? 0 : 1;
  return n;
}

// `text` up to the end of its first `lines` lines.
std::string FirstLines(const std::string& text, size_t lines) {
  size_t end = 0;
  for (size_t i = 0; i < lines && end < text.size(); ++i) {
    const size_t nl = text.find('\n', end);
    end = nl == std::string::npos ? text.size() : nl + 1;
  }
  return text.substr(0, end);
}

// The line of a section header "[name]" (or "[[name]]"), 1-based; 0 if none.
size_t SectionLine(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  size_t n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    const std::string t = CLI::detail::trim_copy(line);
    if (t == "[" + name + "]" || t == "[[" + name + "]]") return n;
  }
  return 0;
}

std::string Join(const std::vector<std::string>& values) {
  std::string out;
  for (const std::string& v : values) out += (out.empty() ? "" : ", ") + v;
  return out;
}

// Why `value` cannot be the value of `op` ("" when it can), the way CLI11 will convert it.
std::string ValueProblem(const CLI::Option& op, const std::string& value) {
  if (op.get_expected_min() == 0) {  // a flag
    try {
      (void)CLI::detail::to_flag_value(value);
    } catch (const std::invalid_argument&) {
      return "is not true or false";
    } catch (const std::out_of_range&) {
      // a number too large for 64 bits is still true or false by its sign (as CLI11 reads it)
    }
    return "";
  }
  std::string type = op.get_type_name();
  type = type.substr(0, type.find(':'));
  if (std::string why = IntegerProblem(type, value); !why.empty()) return why;
  if (type == "FLOAT") {
    double v = 0;
    if (!CLI::detail::lexical_cast(value, v)) return "is not a number";
  }
  return "";
}

class JobFileReader : public CLI::ConfigTOML {
 public:
  JobFileReader(const CLI::App* app, JobFileKeys* keys) : app_(app), keys_(keys) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    const std::string text(std::istreambuf_iterator<char>(input), {});
    keys_->Reset(FileName(), text);
    std::istringstream copy(text);
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(copy);
    std::string section = "train";
    const std::vector<CLI::App*> selected = app_->get_subcommands();
    if (!selected.empty()) section = selected.front()->get_name();
    std::vector<std::string> commands;
    for (const CLI::App* s : app_->get_subcommands([](const CLI::App*) { return true; })) {
      commands.push_back(s->get_name());
    }
    std::set<const CLI::Option*> seen;
    size_t index = 0;
    for (CLI::ConfigItem& item : items) {
      const bool top = item.parents.empty();  // keys name themselves as written
      if (top) item.parents = {section};
      const std::string key = top ? item.name : item.fullname();
      const CLI::App* sub = SubcommandNamed(item.parents.front());
      if (IsMarker(item)) {
        if (item.parents.size() != 1 || sub == nullptr) {
          const std::string name = CLI::detail::join(item.parents, ".");
          throw CLI::ConfigError(keys_->file() + ":" + std::to_string(SectionLine(text, name)) +
                                 ": unknown section [" + name +
                                 "] (sections are ferry's commands: " + Join(commands) + ")");
        }
        continue;
      }
      const size_t at = index++;
      auto fail = [&](const std::string& what) {
        throw CLI::ConfigError(keys_->Location(at) + ": " + what);
      };
      if (item.parents.size() != 1 || sub == nullptr) {
        fail("'" + key + "' is not a job option (keys are a command's options " +
             "without dashes, at the top or in a [command] section: " + Join(commands) + ")");
      }
      const CLI::Option* op = sub->get_option_no_throw("--" + item.name);
      if (op == nullptr && app_->get_option_no_throw("--" + item.name) != nullptr) {
        fail("'" + item.name + "' cannot be set in a job file");
      }
      if (op == nullptr) {
        std::vector<std::string> keys;
        for (const std::string& flag : OptionNames(*sub)) keys.push_back(flag.substr(2));
        const std::string near = ClosestName(item.name, keys);
        fail("unknown key '" + item.name + "'" +
             (near.empty() ? "" : "; did you mean '" + near + "'?") + " (keys are `ferry " +
             sub->get_name() + "` options without dashes)");
      }
      if (!op->get_configurable() || op == sub->get_help_ptr() || op == sub->get_help_all_ptr()) {
        fail("'" + item.name + "' cannot be set in a job file");
      }
      if (!seen.insert(op).second) fail("'" + key + "' is set twice");
      const std::string value = Join(item.inputs);
      if (item.inputs.size() != 1) {
        fail(key + " = " + value + ": " + op->get_name() + " takes one value, not " +
             std::to_string(item.inputs.size()));
      }
      if (op->count() > 0) continue;  // the command line gave it: CLI11 keeps that value
      if (std::string why = ValueProblem(*op, item.inputs.front()); !why.empty()) {
        fail(key + " = " + value + ": '" + value + "' " + why + " (" + op->get_name() + ")");
      }
      if (sub->get_name() == section) keys_->Set(op->get_name(), {key, value, at});
    }
    return items;
  }

 private:
  std::string FileName() const {
    const CLI::Option* config = app_->get_config_ptr();
    return config != nullptr && !config->results().empty() ? config->results().back() : "job file";
  }
  const CLI::App* SubcommandNamed(const std::string& name) const {
    for (const CLI::App* s : app_->get_subcommands([](const CLI::App*) { return true; })) {
      if (s->get_name() == name) return s;
    }
    return nullptr;
  }

  const CLI::App* app_;
  JobFileKeys* keys_;
};

}  // namespace

std::string IntegerProblem(const std::string& type, const std::string& value) {
  if (type != "INT" && type != "UINT") return "";
  const bool is_signed = type == "INT";
  const std::string want = is_signed ? "is not a whole number (in 64 bits)"
                                     : "is not a whole number of 0 or more (in 64 bits)";
  // As CLI11 reads it (base 0: 0x.. hexadecimal, 0.. octal), and within range.
  if (value.empty() || (!is_signed && value.find('-') != std::string::npos)) return want;
  char* end = nullptr;
  errno = 0;
  if (is_signed) {
    (void)std::strtoll(value.c_str(), &end, 0);
  } else {
    (void)std::strtoull(value.c_str(), &end, 0);
  }
  return errno == ERANGE || end != value.c_str() + value.size() ? want : "";
}

void RefuseOutOfRangeIntegers(CLI::App& app) {
  for (CLI::Option* op : app.get_options()) {
    std::string type = op->get_type_name();
    type = type.substr(0, type.find(':'));
    if (type != "INT" && type != "UINT") continue;
    op->check(CLI::Validator(
        [type](std::string& value) {
          const std::string why = IntegerProblem(type, value);
          return why.empty() ? why : "'" + value + "' " + why;
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    RefuseOutOfRangeIntegers(*sub);
  }
}

size_t JobFileItemLine(const std::string& text, size_t item) {
  const size_t lines = size_t(std::count(text.begin(), text.end(), '\n')) + 1;
  if (KeyItems(text) <= item) return 0;
  // The fewest first lines whose items include the wanted one (the count grows with the lines).
  size_t lo = 0, hi = lines;  // KeyItems(FirstLines(lo)) <= item < KeyItems(FirstLines(hi))
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    (KeyItems(FirstLines(text, mid)) > item ? hi : lo) = mid;
  }
  return hi;
}

std::string JobFileKeys::Where(const std::string& message) const {
  for (size_t at = message.find("--"); at != std::string::npos; at = message.find("--", at + 2)) {
    size_t end = at + 2;
    while (end < message.size() &&
           (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-')) {
      ++end;
    }
    auto it = options_.find(message.substr(at, end - at));
    if (it != options_.end()) {
      return Location(it->second.item) + ": " + it->second.key + " = " + it->second.value;
    }
  }
  return "";
}

Status JobFileKeys::Annotate(const Status& s) const {
  const std::string where = Where(s.message());
  return where.empty() ? s : s.WithContext(where);
}

void JobFileKeys::Reset(std::string file, std::string text) {
  file_ = std::move(file);
  text_ = std::move(text);
  options_.clear();
}

void JobFileKeys::Set(const std::string& option, Entry entry) {
  options_[option] = std::move(entry);
}

std::string JobFileKeys::Location(size_t item) const {
  const size_t line = JobFileItemLine(text_, item);
  return file_ + ":" + (line == 0 ? std::string("?") : std::to_string(line));
}

void InstallJobFile(CLI::App& app, JobFileKeys* keys) {
  app.config_formatter(std::make_shared<JobFileReader>(&app, keys));
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "",
                 "Job file (TOML): every key is an option of the command without dashes, e.g. "
                 "`steps = 100`; options given on the command line win");
}

}  // namespace ferry
