#include "engine/train/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ferry {
namespace {

// Python's repr of a float.
void AppendFloat(std::string& out, double x) {
  if (std::isnan(x)) {
    out += "NaN";
    return;
  }
  if (std::isinf(x)) {
    out += x < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[64];
  // The shortest digits that round-trip, as d[.ddd]e±XX.
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  if (sci[0] == '-') {
    out += '-';
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // the '.'
  const int exponent = std::atoi(sci.c_str() + e + 1);
  const int decpt = exponent + 1;  // x = 0.d1d2... * 10^decpt
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(size_t(-decpt), '0') + digits;
    } else if (size_t(decpt) >= digits.size()) {
      out += digits + std::string(size_t(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
    }
    return;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  std::snprintf(buf, sizeof buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  out += buf;
}

// `indent` < 0: one line; else `level` is the depth of `v` (its elements go one deeper).
void Append(std::string& out, const nlohmann::ordered_json& v, int indent, int level) {
  const bool lines = indent >= 0 && !v.empty() && (v.is_array() || v.is_object());
  const std::string inner = lines ? "\n" + std::string(size_t(indent * (level + 1)), ' ') : "";
  const std::string between = lines ? "," + inner : ", ";
  if (v.is_array()) {
    out += '[' + inner;
    for (size_t k = 0; k < v.size(); ++k) {
      if (k > 0) out += between;
      Append(out, v[k], indent, level + 1);
    }
    if (lines) out += "\n" + std::string(size_t(indent * level), ' ');
    out += ']';
  } else if (v.is_object()) {
    out += '{' + inner;
    bool first = true;
    for (const auto& [key, e] : v.items()) {
      if (!first) out += between;
      first = false;
      out += nlohmann::ordered_json(key).dump() + ": ";
      Append(out, e, indent, level + 1);
    }
    if (lines) out += "\n" + std::string(size_t(indent * level), ' ');
    out += '}';
  } else if (v.is_number_float()) {
    AppendFloat(out, v.get<double>());
  } else {
    // Strings, integers, booleans and null: nlohmann writes them as Python does (without
    // ensure_ascii: '"', '\\', \b \f \n \r \t escaped, other bytes below 0x20 as \u00XX in
    // lowercase hex, the rest as it is).
    out += v.dump();
  }
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::ordered_json& v, int indent) {
  std::string out;
  Append(out, v, indent, 0);
  return out;
}

}  // namespace ferry
