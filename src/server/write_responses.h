// The Responses API's answer: the response object and its SSE events. One
// builder takes the answer as it arrives (all at once for a non-streaming
// request), so that both kinds of request end with the same output items.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_pool.h"
#include "server/answer_parser.h"
#include "server/parse_responses.h"
#include "server/submit.h"
#include "text/tool_calls.h"

namespace wick::server {

// Unguessable ids (the store answers whoever knows one): resp_ and 32 hex digits.
std::string new_response_id();

// The input items of a stored response, oldest first: the conversation it
// answered (a previous_response_id chain's earlier inputs and answers
// included; not its instructions) as message, function_call and
// function_call_output items, with ids derived from the response's.
json input_items(const std::string& response_id, const json& conversation);

// One response's output as its answer arrives: a reasoning item for <think>
// reasoning (when the request splits it), a message item for text, a
// function_call item for each call, and each change as the events
// (response.output_item.added, response.output_text.delta, ...) that the
// Responses API streams.
class ResponseBuilder {
 public:
  ResponseBuilder(const ResponsesRequest& r, std::string id, std::string model,
                  std::shared_ptr<const LoadedModel> m);
  // response.created and response.in_progress.
  std::string start();
  // logprobs: those of the tokens computed since the last piece.
  std::string text(const std::string& piece, const std::vector<TokenLogprob>& logprobs);
  // The items closed, then response.completed (response.incomplete when
  // max_output_tokens cut it, response.failed when the engine failed it).
  std::string finish(const GenerateResult& r);
  // The response object as it stands (the whole of it after finish).
  const json& response() const { return response_; }
  // The answer as a chat message, for the conversation a later request continues.
  json assistant_message() const;

 private:
  std::string event(json e);
  // An item with one content part written as text arrives (a message, a
  // reasoning item): added at index; closed with its text's done event.
  std::string open_item(json item, const json& part, int64_t& index);
  std::string close_item(int64_t& index, const char* done_type, bool complete);
  std::string open_message();
  std::string close_message(bool complete);
  std::string add_call(const ToolCall& c);
  std::string content(const std::string& s);
  std::string reasoning(const std::string& s);
  std::string close_reasoning(bool complete);
  std::string answer(const std::vector<AnswerEvent>& evs);
  json take_logprobs();

  std::string hex_;  // the id's digits, shared by its items' ids
  ToolSetup tools_;
  bool logprobs_;
  std::shared_ptr<const LoadedModel> model_;  // its tokenizer names the logprobs' tokens
  AnswerParser parser_;
  json response_;
  int64_t seq_ = 0;                    // the events' sequence_number
  int64_t open_ = -1;                  // output index of the message item being written
  int64_t thinking_ = -1;              // output index of the reasoning item being written
  size_t n_messages_ = 0;              // message items opened
  size_t n_calls_ = 0;                 // calls output
  std::vector<TokenLogprob> pending_;  // logprobs not yet in a delta
  size_t n_logprobs_seen_ = 0;
};

// A streamed response: the builder's events; on_done gets the builder once
// the response is finished (the store keeps it).
class ResponsesStream : public StreamWriter {
 public:
  ResponsesStream(std::shared_ptr<ResponseBuilder> b,
                  std::function<void(const ResponseBuilder&)> on_done)
      : b_(std::move(b)), on_done_(std::move(on_done)) {}
  std::string text(size_t, const std::string& piece,
                   const std::vector<TokenLogprob>& logprobs) override;
  std::string done(size_t, const GenerateResult& r) override;
  std::string end() override { return ""; }  // no [DONE]: response.completed ends it

 private:
  std::string started();
  std::shared_ptr<ResponseBuilder> b_;
  std::function<void(const ResponseBuilder&)> on_done_;
  bool started_ = false;
};

}  // namespace wick::server
