// KV-cache events for prefix-aware routers (llm-d, Dynamo and others that
// read vLLM's): each batch of blocks the prefix cache stored or dropped goes
// out on a ZMQ PUB socket as vLLM publishes them: a multipart message
// [topic, sequence number (8 bytes, big-endian), msgpack KVEventBatch], the
// batch an array [timestamp, events], an event an array tagged by its name:
// ["BlockStored", [hash], parent hash or nil, token ids, block size, nil
// (LoRA), medium] or ["BlockRemoved", [hash], medium]. Hashes are wick's
// chained prefix-cache hashes (64-bit, model identity mixed in).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kv/block_pool.h"

namespace wick::server {

class KvEventPublisher {
 public:
  // Binds endpoint (a ZMQ address such as tcp://*:5557); throws with the
  // reason when it cannot.
  KvEventPublisher(const std::string& endpoint, std::string topic);
  ~KvEventPublisher();
  // One batch; medium names where the blocks live ("CPU" or "GPU").
  void publish(std::span<const BlockPool::Event> events, int32_t block_size,
               const std::string& medium);

 private:
  struct Zmq;
  std::unique_ptr<Zmq> zmq_;
  std::string topic_;
  uint64_t seq_ = 0;
};

}  // namespace wick::server
