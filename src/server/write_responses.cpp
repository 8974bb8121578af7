#include "server/write_responses.h"

#include <random>

#include "server/write_openai.h"

namespace wick::server {

json input_items(const std::string& response_id, const json& conversation) {
  const std::string hex = response_id.substr(response_id.find('_') + 1);
  json items = json::array();
  auto id = [&](const char* prefix) {
    return fmt::format("{}_{}_in{}", prefix, hex, items.size());
  };
  for (const json& m : conversation) {
    const std::string role = m.value("role", "");
    const std::string text = m.contains("content") && m["content"].is_string()
                                 ? m["content"].get<std::string>()
                                 : std::string();
    if (role == "tool") {
      items.push_back({{"id", id("fco")},
                       {"type", "function_call_output"},
                       {"call_id", m.value("tool_call_id", "")},
                       {"output", text},
                       {"status", "completed"}});
      continue;
    }
    const bool assistant = role == "assistant";
    if (!assistant || !text.empty()) {
      json part = {{"type", assistant ? "output_text" : "input_text"}, {"text", text}};
      if (assistant) part["annotations"] = json::array();
      items.push_back({{"id", id("msg")},
                       {"type", "message"},
                       {"role", role},
                       {"status", "completed"},
                       {"content", json::array({std::move(part)})}});
    }
    if (m.contains("tool_calls"))
      for (const json& c : m["tool_calls"])
        items.push_back({{"id", id("fc")},
                         {"type", "function_call"},
                         {"call_id", c.value("id", "")},
                         {"name", c["function"].value("name", "")},
                         {"arguments", c["function"].value("arguments", "")},
                         {"status", "completed"}});
  }
  return items;
}

std::string new_response_id() {
  std::random_device rd;
  auto u64 = [&] { return (uint64_t(rd()) << 32) | rd(); };
  return fmt::format("resp_{:016x}{:016x}", u64(), u64());
}

ResponseBuilder::ResponseBuilder(const ResponsesRequest& r, std::string id, std::string model,
                                 std::shared_ptr<const LoadedModel> m)
    : hex_(id.substr(id.find('_') + 1)),
      tools_(r.chat.tools),
      logprobs_(r.chat.gen.top_logprobs >= 0),
      model_(std::move(m)),
      parser_(r.chat.reasoning, r.chat.tools, "call_" + hex_ + "_") {
  response_ = {{"id", std::move(id)},          {"object", "response"}, {"created_at", unix_now()},
               {"status", "in_progress"},      {"background", false},  {"error", nullptr},
               {"incomplete_details", nullptr}};
  response_["model"] = std::move(model);
  response_["output"] = json::array();
  for (const auto& [k, v] : r.echo.items()) response_[k] = v;
  response_["usage"] = nullptr;
}

std::string ResponseBuilder::event(json e) {
  e["sequence_number"] = seq_++;
  return "event: " + e["type"].get<std::string>() +
         "\ndata: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string ResponseBuilder::start() {
  std::string out = event({{"type", "response.created"}, {"response", response_}});
  return out + event({{"type", "response.in_progress"}, {"response", response_}});
}

json ResponseBuilder::take_logprobs() {
  if (!logprobs_) return json::array();
  json lp = logprob_entries(*model_->tokenizer, pending_);
  pending_.clear();
  return lp;
}

std::string ResponseBuilder::open_item(json item, const json& part, int64_t& index) {
  json& output = response_["output"];
  index = int64_t(output.size());
  output.push_back(std::move(item));
  std::string out = event(
      {{"type", "response.output_item.added"}, {"output_index", index}, {"item", output[index]}});
  out += event({{"type", "response.content_part.added"},
                {"item_id", output[index]["id"]},
                {"output_index", index},
                {"content_index", 0},
                {"part", part}});
  output[index]["content"].push_back(part);
  return out;
}

std::string ResponseBuilder::close_item(int64_t& index, const char* done_type, bool complete) {
  if (index < 0) return "";
  json& item = response_["output"][index];
  item["status"] = complete ? "completed" : "incomplete";
  const json& part = item["content"][0];
  json done = {{"type", done_type},
               {"item_id", item["id"]},
               {"output_index", index},
               {"content_index", 0},
               {"text", part["text"]}};
  if (part.contains("logprobs")) done["logprobs"] = part["logprobs"];
  std::string out = event(std::move(done));
  out += event({{"type", "response.content_part.done"},
                {"item_id", item["id"]},
                {"output_index", index},
                {"content_index", 0},
                {"part", part}});
  out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  index = -1;
  return out;
}

std::string ResponseBuilder::open_message() {
  const std::string id =
      n_messages_ == 0 ? "msg_" + hex_ : fmt::format("msg_{}_{}", hex_, n_messages_);
  ++n_messages_;
  return open_item({{"id", id},
                    {"type", "message"},
                    {"status", "in_progress"},
                    {"role", "assistant"},
                    {"content", json::array()}},
                   {{"type", "output_text"},
                    {"annotations", json::array()},
                    {"logprobs", json::array()},
                    {"text", ""}},
                   open_);
}

std::string ResponseBuilder::close_message(bool complete) {
  return close_item(open_, "response.output_text.done", complete);
}

std::string ResponseBuilder::reasoning(const std::string& s) {
  if (s.empty()) return "";
  std::string out;
  if (thinking_ < 0) {
    out += close_message(true);
    out += open_item({{"id", "rs_" + hex_},
                      {"type", "reasoning"},
                      {"status", "in_progress"},
                      {"summary", json::array()},
                      {"content", json::array()}},
                     {{"type", "reasoning_text"}, {"text", ""}}, thinking_);
  }
  json& item = response_["output"][thinking_];
  item["content"][0]["text"].get_ref<std::string&>() += s;
  return out + event({{"type", "response.reasoning_text.delta"},
                      {"item_id", item["id"]},
                      {"output_index", thinking_},
                      {"content_index", 0},
                      {"delta", s}});
}

std::string ResponseBuilder::close_reasoning(bool complete) {
  return close_item(thinking_, "response.reasoning_text.done", complete);
}

std::string ResponseBuilder::content(const std::string& s) {
  if (s.empty()) return "";
  std::string out = close_reasoning(true);
  if (open_ < 0) out += open_message();
  json& item = response_["output"][open_];
  json& part = item["content"][0];
  part["text"].get_ref<std::string&>() += s;
  json lps = take_logprobs();
  for (const json& e : lps) part["logprobs"].push_back(e);
  return out + event({{"type", "response.output_text.delta"},
                      {"item_id", item["id"]},
                      {"output_index", open_},
                      {"content_index", 0},
                      {"delta", s},
                      {"logprobs", std::move(lps)}});
}

std::string ResponseBuilder::add_call(const ToolCall& c) {
  if (!tools_.parallel && n_calls_ > 0) return "";  // parallel_tool_calls: false
  std::string out = close_reasoning(true);
  out += close_message(true);
  json& output = response_["output"];
  const int64_t index = int64_t(output.size());
  json item = {{"id", fmt::format("fc_{}_{}", hex_, n_calls_++)},
               {"type", "function_call"},
               {"status", "in_progress"},
               {"arguments", ""},
               {"call_id", c.id},
               {"name", c.name}};
  out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  out += event({{"type", "response.function_call_arguments.delta"},
                {"item_id", item["id"]},
                {"output_index", index},
                {"delta", c.arguments}});
  out += event({{"type", "response.function_call_arguments.done"},
                {"item_id", item["id"]},
                {"output_index", index},
                {"name", c.name},
                {"arguments", c.arguments}});
  item["status"] = "completed";
  item["arguments"] = c.arguments;
  out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output.push_back(std::move(item));
  return out;
}

std::string ResponseBuilder::text(const std::string& piece,
                                  const std::vector<TokenLogprob>& logprobs) {
  pending_.insert(pending_.end(), logprobs.begin(), logprobs.end());
  n_logprobs_seen_ += logprobs.size();
  return answer(parser_.push(piece));
}

std::string ResponseBuilder::answer(const std::vector<AnswerEvent>& evs) {
  std::string out;
  for (const AnswerEvent& e : evs) {
    if (e.kind == AnswerEvent::Kind::Reasoning) out += reasoning(e.text);
    if (e.kind == AnswerEvent::Kind::Content) out += content(e.text);
    if (e.kind == AnswerEvent::Kind::Call) out += add_call(parser_.calls()[e.index]);
  }
  return out;
}

std::string ResponseBuilder::finish(const GenerateResult& r) {
  std::string out;
  if (r.stop_reason.rfind("error", 0) == 0) {
    out += close_reasoning(false);
    out += close_message(false);
    response_["status"] = "failed";
    response_["error"] = {{"code", "server_error"}, {"message", r.stop_reason}};
    return out + event({{"type", "response.failed"}, {"response", response_}});
  }
  out += answer(parser_.finish());
  // tokens whose text never came (an end-of-generation token, a stop string)
  for (size_t k = n_logprobs_seen_; k < r.logprobs.size(); ++k) pending_.push_back(r.logprobs[k]);
  const bool cut = finish_reason(r.stop_reason) == "length";
  out += close_reasoning(!cut);                            // cut while thinking: incomplete
  if (response_["output"].empty()) out += open_message();  // nothing said: an empty message
  if (open_ >= 0)
    for (json& e : take_logprobs())
      response_["output"][open_]["content"][0]["logprobs"].push_back(e);
  out += close_message(!cut);
  response_["status"] = cut ? "incomplete" : "completed";
  if (cut)
    response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  else
    response_["completed_at"] = unix_now();
  const int64_t n_out = int64_t(r.tokens.size());
  json usage = {{"input_tokens", r.n_prompt},
                {"input_tokens_details", {{"cached_tokens", r.n_reused}}},
                {"output_tokens", n_out},
                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", r.n_prompt + n_out}};
  SpecTotals spec;
  spec.add(r);
  if (json s = spec.to_json(); !s.is_null()) usage["speculative"] = std::move(s);
  response_["usage"] = std::move(usage);
  return out + event({{"type", cut ? "response.incomplete" : "response.completed"},
                      {"response", response_}});
}

json ResponseBuilder::assistant_message() const {
  std::string content;
  json calls = json::array();
  for (const json& item : response_["output"]) {
    if (item["type"] == "message")
      content += item["content"][0]["text"].get<std::string>();
    else if (item["type"] == "function_call")  // reasoning is not replayed (templates drop it)
      calls.push_back({{"id", item["call_id"]},
                       {"type", "function"},
                       {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
  }
  json msg = {{"role", "assistant"}, {"content", content}};
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  return msg;
}

std::string ResponsesStream::started() {
  if (started_) return "";
  started_ = true;
  return b_->start();
}

std::string ResponsesStream::text(size_t, const std::string& piece,
                                  const std::vector<TokenLogprob>& logprobs) {
  std::string out = started();
  return out + b_->text(piece, logprobs);
}

std::string ResponsesStream::done(size_t, const GenerateResult& r) {
  std::string out = started();
  out += b_->finish(r);
  if (on_done_) on_done_(*b_);
  return out;
}

}  // namespace wick::server
