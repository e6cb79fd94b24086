-- A real nginx + lua-nginx-module for the OpenResty specs and benchmark
-- (run from Lua 5.4): a temporary prefix, a free loopback port, the
-- repository's lua/ folder on lua_package_path; an HTTP/1.0 client on luv.
--
--   local N = require("support.nginx")
--   local srv = N.start{ http = "...", server = "location /a { ... }" }
--   local status, body = srv:get("/a")
--   srv:stop()          -- always (-s quit, then waits; kill -9 as last resort)
local uv = require("luv")

local N = {}

N.MODULES = "/usr/lib/nginx/modules"
N.NGINX = os.getenv("AH_NGINX") or "nginx"

-- the repository root: two levels above this file
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
N.ROOT = (function()
  local p = io.popen("cd '" .. here .. "/../..' && pwd")
  local r = p:read("l")
  p:close()
  return r
end)()

local function sh(cmd)
  local ok, how, code = os.execute(cmd)
  return ok == true or (how == "exit" and code == 0), code
end

local function slurp(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

--- `sh(cmd)`: whether the shell command succeeded, and its exit code;
-- `slurp(path)`: the file's contents, "" when it cannot be read.
N.sh, N.slurp = sh, slurp

local function spit(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

--- A free loopback TCP port (bound to port 0, then released).
function N.free_port()
  local t = uv.new_tcp()
  assert(t:bind("127.0.0.1", 0))
  local port = t:getsockname().port
  t:close()
  uv.run("nowait")
  return port
end

local CONF = [[
worker_processes %d;
daemon %s;
master_process %s;
pid logs/nginx.pid;
error_log logs/error.log %s;
load_module %s/ndk_http_module.so;
load_module %s/ngx_http_lua_module.so;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path temp/body;
  proxy_temp_path temp/proxy;
  fastcgi_temp_path temp/fastcgi;
  uwsgi_temp_path temp/uwsgi;
  scgi_temp_path temp/scgi;
  lua_package_path "%s/lua/?.lua;%s/lua/?/init.lua;%s/spec/support/?.lua;%s;;";
  %s
  server {
    listen 127.0.0.1:%d;
    location = /__ah_ping { return 204; }
    %s
  }
}
]]

local Server = {}
Server.__index = Server
-- a server that nobody stopped (a crashed spec) is stopped when collected
-- or when the Lua state closes
Server.__gc = function(self) self:stop() end

--- Start nginx.
-- @tparam table o `http` (lines in the http block), `server` (lines in the
--   server block), `lua_path` (more lua_package_path entries), `workers` (1), `log_level` ("error"), `foreground`
--   (true: daemon off + master_process off: for valgrind), `prefix_cmd`
--   (put before the nginx command: "taskset -c 0", "valgrind ...")
function N.start(o)
  local prefix = os.getenv("TMPDIR") or "/tmp"
  local p = io.popen("mktemp -d " .. prefix .. "/ah-nginx-XXXXXX")
  prefix = p:read("l")
  p:close()
  -- workers run as nobody when the master is root: let them in
  assert(sh(("mkdir -p '%s/conf' '%s/logs' '%s/temp' && chmod 755 '%s'"):format(prefix, prefix, prefix, prefix)))
  local port = o.port or N.free_port()
  local fg = o.foreground
  spit(prefix .. "/conf/nginx.conf", CONF:format(o.workers or 1, fg and "off" or "on", fg and "off" or "on",
    o.log_level or "error", N.MODULES, N.MODULES, N.ROOT, N.ROOT, N.ROOT, o.lua_path or "", o.http or "", port, o.server or ""))
  local self = setmetatable({ prefix = prefix, port = port }, Server)
  local cmd = ("%s %s -p '%s/' -c conf/nginx.conf"):format(o.prefix_cmd or "", N.NGINX, prefix)
  if fg then
    self.fg = true
    local h = io.popen(("%s >'%s/logs/stdout' 2>&1 & echo $!"):format(cmd, prefix))
    self.pid = tonumber(h:read("l"))
    h:close()
  else
    local ok = sh(cmd .. (" 2>'%s/logs/start.err'"):format(prefix))
    if not ok then
      local why = slurp(prefix .. "/logs/start.err") .. slurp(prefix .. "/logs/error.log")
      sh("rm -rf '" .. prefix .. "'")
      error("nginx did not start: " .. why, 2)
    end
    self.pid = tonumber(slurp(prefix .. "/logs/nginx.pid"))
  end
  -- wait until it accepts
  local deadline = uv.now() + (o.start_timeout or 10) * 1000
  while true do
    local st = self:get("/__ah_ping", 2)
    if st then break end
    uv.update_time()
    if uv.now() > deadline then
      self:stop()
      error("nginx did not answer on port " .. port .. ": " .. self.log, 2)
    end
    uv.sleep(50)
  end
  return self
end

local function alive(pid)
  return pid and sh("kill -0 " .. pid .. " 2>/dev/null")
end

--- Stop nginx (graceful quit, waits up to 10 s, then kill -9), keep the
-- error log in `self.log`, remove the prefix.  Idempotent.
function Server:stop()
  if self.stopped then return self.log end
  self.stopped = true
  if self.fg then
    sh("kill -QUIT " .. self.pid .. " 2>/dev/null")
  else
    sh(("%s -p '%s/' -c conf/nginx.conf -s quit 2>/dev/null"):format(N.NGINX, self.prefix))
  end
  for _ = 1, 200 do
    if not alive(self.pid) then break end
    uv.sleep(50)
  end
  if alive(self.pid) then sh("kill -9 " .. self.pid .. " 2>/dev/null") end
  self.log = slurp(self.prefix .. "/logs/error.log")
  self.stdout = slurp(self.prefix .. "/logs/stdout")
  if not os.getenv("AH_KEEP_PREFIX") then sh("rm -rf '" .. self.prefix .. "'") end
  return self.log
end

--- The error log so far.
function Server:errors()
  return slurp(self.prefix .. "/logs/error.log")
end

function Server:url(path)
  return ("http://127.0.0.1:%d%s"):format(self.port, path)
end

-- one HTTP/1.0 GET on the running loop; cb(status|nil, body|err)
local function request(port, path, cb)
  local t = uv.new_tcp()
  local chunks = {}
  local done = false
  local function finish(st, body, head)
    if done then return end
    done = true
    if not t:is_closing() then t:close() end
    cb(st, body, head)
  end
  t:connect("127.0.0.1", port, function(err)
    if err then return finish(nil, err) end
    t:write("GET " .. path .. " HTTP/1.0\r\nHost: localhost\r\n\r\n")
    t:read_start(function(rerr, data)
      if rerr then return finish(nil, rerr) end
      if data then
        chunks[#chunks + 1] = data
      else
        local resp = table.concat(chunks)
        local st = tonumber(resp:match("^HTTP/1%.%d (%d%d%d)"))
        local head, body = resp:match("^(.-\r\n)\r\n(.*)$")
        if st then finish(st, body, head) else finish(nil, "bad response: " .. resp) end
      end
    end)
  end)
end

--- Issue the GETs all at once; returns a list of {status, body, headers}
-- in order (headers: the raw header block).
-- @param timeout seconds (10)
function Server:get_many(paths, timeout)
  local results, pending = {}, #paths
  for i, path in ipairs(paths) do
    request(self.port, path, function(st, body, head)
      results[i] = { st, body, head }
      pending = pending - 1
    end)
  end
  local timer = uv.new_timer()
  local timed_out = false
  timer:start((timeout or 10) * 1000, 0, function() timed_out = true end)
  while pending > 0 and not timed_out do uv.run("once") end
  timer:close()
  uv.run("nowait")
  for i = 1, #paths do results[i] = results[i] or { nil, "timeout" } end
  return results
end

--- One GET: status, body (nil, error on failure).
function Server:get(path, timeout)
  local r = self:get_many({ path }, timeout)[1]
  return r[1], r[2]
end

return N
