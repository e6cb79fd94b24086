--- A client that sends an exact number of requests:
--   lua5.4 bench/http_client.lua <port> <requests> <connections>
-- Each keep-alive connection sends its next GET when the previous answer
-- has arrived, until <requests> have been sent in all; then every
-- connection closes.  Raw luv, no library.  Prints "DONE <answers>".
local uv = require("luv")
local port, total, conns = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3]) or 1
assert(port and total and total >= 1, "usage: http_client.lua <port> <requests> [connections]")
local REQ = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
local sent, answered = 0, 0

local function connection()
  local c = uv.new_tcp()
  local buf = ""
  local function send()
    if sent >= total then c:close() return end
    sent = sent + 1
    c:write(REQ)
  end
  c:connect("127.0.0.1", port, function(err)
    assert(not err, err)
    c:read_start(function(rerr, data)
      assert(not rerr, rerr)
      if not data then c:close() return end
      buf = buf .. data
      while true do
        local e = buf:find("\r\n\r\n", 1, true)
        local len = e and tonumber(buf:sub(1, e):match("Content%-Length: (%d+)"))
        if not (len and #buf >= e + 3 + len) then break end
        buf = buf:sub(e + 4 + len)
        answered = answered + 1
        send()
      end
    end)
    send()
  end)
end

for _ = 1, math.min(conns, total) do connection() end
uv.run()
io.stdout:write("DONE ", answered, "\n")
os.exit(answered == total and 0 or 1)
