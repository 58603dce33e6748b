// PythonJsonDumps against what Python's json.dumps(x, ensure_ascii=False) prints (the expected
// strings are Python 3's; tests/dataset_check.py compares random values with Python itself).
#include "engine/train/python_json.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

std::string Dumps(const char* json) { return PythonJsonDumps(nlohmann::ordered_json::parse(json)); }

TEST(PythonJson, SeparatorsAndKeyOrderAsPythonWritesThem) {
  EXPECT_EQ(Dumps(R"({"z": 1, "a": [true, null, "x", {}], "m": []})"),
            R"({"z": 1, "a": [true, null, "x", {}], "m": []})");
  EXPECT_EQ(Dumps(R"({"b":{"y":2,"x":1},"a":0})"), R"({"b": {"y": 2, "x": 1}, "a": 0})");
  EXPECT_EQ(Dumps("[]"), "[]");
  EXPECT_EQ(Dumps("-0"), "0");
  EXPECT_EQ(Dumps("18446744073709551615"), "18446744073709551615");
  EXPECT_EQ(Dumps("-9223372036854775808"), "-9223372036854775808");
}

// json.dumps(indent=N), a template's tojson(indent=4): a line per element and member, "," between,
// empty containers as they are (Python 3's output).
TEST(PythonJson, IndentedAsPythonIndents) {
  const auto v = nlohmann::ordered_json::parse(
      R"({"type":"function","function":{"name":"add","parameters":{"a":[1,[],{}],)"
      R"("b":{"c":null}},"e":[]}})");
  EXPECT_EQ(
      PythonJsonDumps(v, 4),
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"add\",\n"
      "        \"parameters\": {\n            \"a\": [\n                1,\n                [],\n"
      "                {}\n            ],\n            \"b\": {\n                \"c\": null\n"
      "            }\n        },\n        \"e\": []\n    }\n}");
  EXPECT_EQ(PythonJsonDumps(nlohmann::ordered_json::parse(R"([1, {"x": "ω"}])"), 2),
            "[\n  1,\n  {\n    \"x\": \"ω\"\n  }\n]");
  EXPECT_EQ(PythonJsonDumps(nlohmann::ordered_json::parse("5"), 4), "5");
  EXPECT_EQ(PythonJsonDumps(nlohmann::ordered_json::parse("{}"), 4), "{}");
  EXPECT_EQ(PythonJsonDumps(v, -1), Dumps(v.dump().c_str()));  // no indent: one line
}

TEST(PythonJson, FloatsAsPythonsRepr) {
  const std::pair<const char*, const char*> kCases[] = {
      {"1.0", "1.0"},          {"1E2", "100.0"},
      {"0.1", "0.1"},          {"-0.0", "-0.0"},
      {"0.0001", "0.0001"},    {"0.00001", "1e-05"},
      {"1.5e-7", "1.5e-07"},   {"1e15", "1000000000000000.0"},
      {"1e16", "1e+16"},       {"12345678901234567.0", "1.2345678901234568e+16"},
      {"2.5e300", "2.5e+300"}, {"0.3333333333333333", "0.3333333333333333"},
  };
  for (auto [in, want] : kCases) EXPECT_EQ(Dumps(in), want) << in;
}

TEST(PythonJson, StringsEscapedAsPythonEscapesThem) {
  EXPECT_EQ(Dumps(R"("a\"b\\c\/d")"), R"("a\"b\\c/d")");
  EXPECT_EQ(Dumps(R"("\b\f\n\r\t\u0001\u001f\u007f")"), "\"\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\"");
  EXPECT_EQ(Dumps(R"("é中😀\u00e9")"), "\"é中😀é\"");                    // ensure_ascii=False
  EXPECT_EQ(Dumps(R"({"k\n": "<tag>&'"})"), R"({"k\n": "<tag>&'"})");  // no HTML escaping
}

}  // namespace
}  // namespace ferry
