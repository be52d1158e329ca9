#include "runtime/engine/output_processor.h"

#include <string>
#include <utility>

namespace strata::runtime {

OutputProcessor::OutputProcessor() : thread_([this] { Run(); }) {}

OutputProcessor::~OutputProcessor() { Close(); }

void OutputProcessor::Emit(OutputEvent event) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(event));
  }
  wake_.notify_one();
}

void OutputProcessor::Close() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void OutputProcessor::Run() {
  while (true) {
    std::deque<OutputEvent> events;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, and everything was delivered
      events.swap(queue_);
    }
    for (OutputEvent& event : events) {
      if (auto* open = std::get_if<OpenStream>(&event)) {
        streams_[open->sequence] = std::move(open->stream);
      } else {
        Deliver(std::get<SequenceStep>(event));
      }
    }
  }
}

void OutputProcessor::Deliver(SequenceStep& step) {
  auto it = streams_.find(step.sequence);
  if (it == streams_.end()) return;
  OutputStream& out = *it->second;
  if (out.ended) {
    // A stop string ended it here; what the engine produced after that is dropped.
    if (step.finish) streams_.erase(it);
    return;
  }
  GenerationChunk chunk;
  chunk.prompt_logprobs = std::move(step.prompt_logprobs);
  std::optional<FinishReason> finish = step.finish;
  const bool has_token = step.token.has_value();
  if (has_token) {
    chunk.tokens.push_back(*std::move(step.token));
    ++out.emitted;
  }
  // vLLM's min_tokens: no stop string ends the request before it has that many tokens (their text passes
  // unmatched).
  const bool matching = out.stop && out.emitted >= out.min_tokens;
  if (has_token) {
    if (out.decoder) {
      std::string piece = out.decoder->Step(chunk.tokens.back().id);
      if (matching) {
        StopStringMatcher::Result r = out.stop->Push(piece);
        chunk.text = std::move(r.text);
        if (r.stopped) finish = FinishReason::kStop;
      } else {
        chunk.text = std::move(piece);
      }
    }
  }
  if (finish && *finish != FinishReason::kStop && *finish != FinishReason::kCancelled &&
      *finish != FinishReason::kError) {
    // What the detokenizer and stop matcher still hold comes out with the last chunk, unless a stop
    // string is in it.
    std::string rest = out.decoder ? out.decoder->Finish() : std::string();
    if (matching) {
      StopStringMatcher::Result r = out.stop->Push(rest);
      chunk.text += r.text;
      if (r.stopped) {
        finish = FinishReason::kStop;
      } else {
        chunk.text += out.stop->Flush();
      }
    } else {
      chunk.text += rest;
    }
  }
  chunk.prompt_tokens = out.prompt_tokens;
  chunk.completion_tokens = out.emitted;
  if (finish) {
    chunk.finish = finish;
    if (*finish == FinishReason::kError) chunk.error = step.error;
    out.ended = true;
    // Ended here by a stop string while the engine runs on: tell it to free the blocks.
    if (!step.finish) out.stopped->store(true, std::memory_order_release);
  }
  out.callback(std::move(chunk));
  if (step.finish) streams_.erase(it);
}

}  // namespace strata::runtime
