// Ollama's keep_alive: how long a model stays loaded after a request.
#pragma once

#include <chrono>
#include <string>

#include "server/parse_common.h"

namespace wick::server {

using KeepAlive = std::chrono::milliseconds;  // negative: forever
inline constexpr KeepAlive kKeepForever{-1};

// A Go duration ("5m", "1h30m", "10s", "1.5h", "300ms"), or a whole number
// of seconds ("3600"); negative means forever. nullopt for anything else.
std::optional<KeepAlive> parse_duration(const std::string& s);
// body["keep_alive"]: a duration string or a number of seconds (0: unload
// after the request, negative: forever); absent or null: dflt. 400 otherwise.
KeepAlive keep_alive_of(const json& body, KeepAlive dflt);
// 5m, 1h30m, forever: for logs and errors.
std::string keep_alive_text(KeepAlive k);

}  // namespace wick::server
