// OpenAI's Responses API (POST /v1/responses) read onto the chat path: input
// items become chat messages, function tools and tool_choice chat's shapes,
// text.format a response_format, and the chat parser does the rest, so that
// both endpoints render, sample, constrain and call tools alike. Pure: the
// caller looks up previous_response_id's conversation.
#pragma once

#include <cstdint>
#include <string>

#include "server/api_types.h"
#include "server/parse_common.h"

namespace wick::server {

struct ResponsesRequest {
  OpenAiRequest chat;  // one choice; chat.stream is the request's stream
  // The conversation without instructions: the previous response's, then
  // this request's input as chat messages. With the answer appended it is
  // what a later previous_response_id continues.
  json conversation = json::array();
  // The request's settings that the response object repeats (instructions,
  // tools, text, temperature, ...), in the response's field order.
  json echo = json::object();
  bool store = true;
};

// The body's previous_response_id ("" when none), read before the store is asked.
std::string previous_response_id(const json& body);

// previous: the conversation stored with the response that
// previous_response_id names (an empty array when none). Throws ApiError (400
// naming the request's field, e.g. input[2].content[0].type).
ResponsesRequest parse_responses(const json& body, const ModelView& m, uint64_t random_seed,
                                 const json& previous);

}  // namespace wick::server
