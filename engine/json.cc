// The one copy of nlohmann::json's heavy instantiations (see engine/json.h).
#include "engine/json.h"

template class nlohmann::basic_json<>;
template class std::map<std::string, nlohmann::json, std::less<>>;
template class std::vector<nlohmann::json>;
template class nlohmann::detail::iter_impl<const nlohmann::json>;
template class nlohmann::detail::serializer<nlohmann::json>;
template class nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
template class nlohmann::detail::json_sax_dom_callback_parser<nlohmann::json>;
template class nlohmann::detail::lexer<nlohmann::json, ferry::json_internal::StringAdapter>;
template class nlohmann::detail::lexer<nlohmann::json, ferry::json_internal::CharsAdapter>;
template class nlohmann::detail::lexer<nlohmann::json, ferry::json_internal::StreamAdapter>;
template class nlohmann::detail::parser<nlohmann::json, ferry::json_internal::StringAdapter>;
template class nlohmann::detail::parser<nlohmann::json, ferry::json_internal::CharsAdapter>;
template class nlohmann::detail::parser<nlohmann::json, ferry::json_internal::StreamAdapter>;
