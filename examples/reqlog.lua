--- A logger deep inside "library code": it receives nothing about the
-- request, yet every line carries the id of the request it runs for.
local ah = require("async_hooks")

local M = {}

--- The current request's id (an `AsyncLocal`), set once per request.
M.request_id = ah.AsyncLocal.new { name = "request_id", default = "-" }

M.lines = {}
M.echo = true

--- Log a line, prefixed with the current request's id.
function M.info(fmt, ...)
  local line = ("[req %s] " .. fmt):format(M.request_id:get(), ...)
  M.lines[#M.lines + 1] = { id = M.request_id:get(), text = line }
  if M.echo then print(line) end
end

return M
