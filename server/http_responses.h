#pragma once
// The HTTP responses of strata's OpenAI-compatible API, shared by its router (server/http_api.h) and its
// generations (server/http_generation.h): a JSON body, an error in OpenAI's shape, the "created" clock.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"

namespace strata::server {

// JSON as the API writes it: compact, invalid UTF-8 replaced.
std::string DumpJson(const openai::Json& json);

HttpResponse JsonResponse(const openai::Json& body, int status = 200);

// OpenAI's {"error": {...}} with the error's HTTP status (and WWW-Authenticate: Bearer on a 401).
HttpResponse ErrorResponse(const openai::ApiError& error);
HttpResponse ErrorResponse(const absl::Status& status);  // openai::ErrorFromStatus

// Seconds since the Unix epoch: the "created" of responses and of /v1/models.
int64_t UnixSeconds();

}  // namespace strata::server
