// JSON text as Python's json.dumps writes it with its defaults and ensure_ascii=False: what a
// chat template's `tojson` filter writes (transformers' own filter: json.dumps(x,
// ensure_ascii=False)), so that tool calls and tool lists render as the model's template renders
// them.
//
//  - ", " between elements and members, ": " after a key; keys in the order the value holds them
//    (nlohmann::ordered_json keeps the order of the text it parsed, as Python's dict does)
//  - strings: '"', '\\', \b \f \n \r \t escaped as such, other bytes below 0x20 as \u00XX
//    (lowercase hex); everything else, non-ASCII UTF-8 included, as it is
//  - integers in decimal; floats as Python's repr: the shortest digits that read back the same,
//    in fixed notation with at least one decimal ("100.0", "0.0001") when the decimal exponent is
//    in [-4, 16), else as "1e-05", "1.5e+16" (Infinity and NaN as Python's, though no JSON text
//    nlohmann reads holds them)
//
// With `indent` >= 0 (json.dumps(indent=N), a template's `tojson(indent=4)`): each element and
// member on a line of its own, indented N spaces a level, "," between them (no space), ": " after
// a key; an empty array or object stays "[]", "{}".
//
// Limits: integers beyond 64 bits, which nlohmann reads as floats, are written as floats.
// Plain function; thread-safe.
#pragma once

#include <string>

#include "engine/json.h"

namespace ferry {

std::string PythonJsonDumps(const nlohmann::ordered_json& v, int indent = -1);

}  // namespace ferry
