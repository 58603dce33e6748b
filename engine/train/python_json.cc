#include "engine/train/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ferry {
namespace {

void AppendString(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

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

void Append(std::string& out, const nlohmann::ordered_json& v) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null:
      out += "null";
      break;
    case nlohmann::ordered_json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::ordered_json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case nlohmann::ordered_json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case nlohmann::ordered_json::value_t::number_float:
      AppendFloat(out, v.get<double>());
      break;
    case nlohmann::ordered_json::value_t::string:
      AppendString(out, v.get_ref<const std::string&>());
      break;
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      bool first = true;
      for (const nlohmann::ordered_json& e : v) {
        if (!first) out += ", ";
        first = false;
        Append(out, e);
      }
      out += ']';
      break;
    }
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        AppendString(out, key);
        out += ": ";
        Append(out, e);
      }
      out += '}';
      break;
    }
    default:
      out += "null";
      break;  // binary and discarded values: not from JSON text
  }
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::ordered_json& v) {
  std::string out;
  Append(out, v);
  return out;
}

}  // namespace ferry
