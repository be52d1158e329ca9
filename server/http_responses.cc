#include "server/http_responses.h"

#include <chrono>

namespace strata::server {

std::string DumpJson(const openai::Json& json) {
  return json.dump(-1, ' ', false, openai::Json::error_handler_t::replace);
}

HttpResponse JsonResponse(const openai::Json& body, int status) {
  HttpResponse response;
  response.status = status;
  response.body = DumpJson(body);
  return response;
}

HttpResponse ErrorResponse(const openai::ApiError& error) {
  HttpResponse response;
  response.status = error.status;
  response.body = openai::ErrorBody(error);
  if (error.status == 401) response.headers.emplace_back("WWW-Authenticate", "Bearer");
  return response;
}

HttpResponse ErrorResponse(const absl::Status& status) { return ErrorResponse(openai::ErrorFromStatus(status)); }

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace strata::server
