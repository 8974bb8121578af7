#include "server/kv_events.h"

#include <chrono>
#include <msgpack.hpp>
#include <stdexcept>
#include <zmq.hpp>

namespace wick::server {

struct KvEventPublisher::Zmq {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
};

KvEventPublisher::KvEventPublisher(const std::string& endpoint, std::string topic)
    : zmq_(std::make_unique<Zmq>()), topic_(std::move(topic)) {
  try {
    zmq_->pub.set(zmq::sockopt::linger, 0);  // never hold the server's exit
    zmq_->pub.set(zmq::sockopt::sndhwm, 100000);
    zmq_->pub.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("--kv-events " + endpoint + ": " + e.what());
  }
}

KvEventPublisher::~KvEventPublisher() = default;

void KvEventPublisher::publish(std::span<const BlockPool::Event> events, int32_t block_size,
                               const std::string& medium) {
  if (events.empty()) return;
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  pk.pack_array(2);
  pk.pack_double(ts);
  pk.pack_array(uint32_t(events.size()));
  for (const BlockPool::Event& e : events) {
    if (e.stored) {
      pk.pack_array(7);
      pk.pack(std::string("BlockStored"));
      pk.pack_array(1);
      pk.pack_uint64(e.hash);
      if (e.parent)
        pk.pack_uint64(*e.parent);
      else
        pk.pack_nil();
      pk.pack(e.tokens);
      pk.pack_int32(block_size);
      if (e.adapter)  // vLLM's lora_id
        pk.pack_int32(e.adapter);
      else
        pk.pack_nil();
      pk.pack(medium);
    } else {
      pk.pack_array(3);
      pk.pack(std::string("BlockRemoved"));
      pk.pack_array(1);
      pk.pack_uint64(e.hash);
      pk.pack(medium);
    }
  }
  unsigned char seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = uint8_t(seq_ >> (56 - 8 * i));
  ++seq_;
  // a slow or absent subscriber drops messages (PUB), it never blocks the engine
  zmq_->pub.send(zmq::buffer(topic_), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  zmq_->pub.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  zmq_->pub.send(zmq::buffer(buf.data(), buf.size()), zmq::send_flags::dontwait);
}

}  // namespace wick::server
