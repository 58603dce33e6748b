// ferry's way in to nlohmann::json: include "engine/json.h", never <nlohmann/json.hpp>.
// (A header that only names nlohmann::json includes "engine/json_fwd.h" instead;
// tests/lint/json_includes.cmake fails on any other file that includes nlohmann's headers.)
//
// nlohmann::json is header-only, so every file that parses or dumps JSON used to compile and
// emit the same parser, lexer, serializer, iterators and container code again (about 60% of a
// small file's compile time in the ASan build). The `extern template` declarations below tell
// the compiler those instantiations exist elsewhere; engine/json.cc holds the one explicit
// instantiation of each, linked into ferry_engine. The compiler may still inline them.
//
// The parser and lexer are instantiated for the inputs ferry parses: std::string (and any
// contiguous char container), const char* ranges (std::string_view iterators), and streams.
// Parsing another input type still works; it just compiles its parser in place.
//
// Thread-safety: as nlohmann::json (a value type; const use is thread-safe).
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>  // IWYU pragma: export
#include <string>
#include <type_traits>
#include <vector>

namespace ferry::json_internal {
using StringAdapter = nlohmann::detail::iterator_input_adapter<std::string::const_iterator>;
using CharsAdapter = nlohmann::detail::iterator_input_adapter<const char*>;
using StreamAdapter = nlohmann::detail::input_stream_adapter;
using ObjectMap = std::map<std::string, nlohmann::json, std::less<>>;
using ArrayVector = std::vector<nlohmann::json>;
static_assert(std::is_same_v<ObjectMap, nlohmann::json::object_t>);
static_assert(std::is_same_v<ArrayVector, nlohmann::json::array_t>);
}  // namespace ferry::json_internal

// Keep this list and engine/json.cc's in step.
extern template class nlohmann::basic_json<>;
extern template class std::map<std::string, nlohmann::json, std::less<>>;
extern template class std::vector<nlohmann::json>;
extern template class nlohmann::detail::iter_impl<const nlohmann::json>;
extern template class nlohmann::detail::serializer<nlohmann::json>;
extern template class nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
extern template class nlohmann::detail::json_sax_dom_callback_parser<nlohmann::json>;
extern template class nlohmann::detail::lexer<nlohmann::json, ferry::json_internal::StringAdapter>;
extern template class nlohmann::detail::lexer<nlohmann::json, ferry::json_internal::CharsAdapter>;
extern template class nlohmann::detail::lexer<nlohmann::json, ferry::json_internal::StreamAdapter>;
extern template class nlohmann::detail::parser<nlohmann::json, ferry::json_internal::StringAdapter>;
extern template class nlohmann::detail::parser<nlohmann::json, ferry::json_internal::CharsAdapter>;
extern template class nlohmann::detail::parser<nlohmann::json, ferry::json_internal::StreamAdapter>;
