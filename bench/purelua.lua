--- The straightforward pure-Lua implementation a user would write without
-- the library: frames in a weak table keyed by thread, coroutine.create
-- wrapped to capture the creator's frame, run() with pcall.
local P = {}
local running, rawcreate = coroutine.running, coroutine.create
local frames = setmetatable({}, { __mode = "k" })
local EMPTY = {}
local NIL = {}

local Local = {}
Local.__index = Local
function P.new(default) return setmetatable({ default = default }, Local) end

function Local:get()
  local v = (frames[running()] or EMPTY)[self]
  if v == nil then return self.default elseif v == NIL then return nil end
  return v
end

local function with(frame, k, v)
  local n = {}
  for k2, v2 in pairs(frame) do n[k2] = v2 end
  if v == nil then v = NIL end
  n[k] = v
  return n
end

function Local:set(v)
  local th = running()
  frames[th] = with(frames[th] or EMPTY, self, v)
end

local function finish(th, prev, ok, ...)
  frames[th] = prev
  if not ok then error((...), 0) end
  return ...
end

function Local:run(v, fn, ...)
  local th = running()
  local prev = frames[th] or EMPTY
  frames[th] = with(prev, self, v)
  return finish(th, prev, pcall(fn, ...))
end

function P.create(fn)
  local co = rawcreate(fn)
  frames[co] = frames[running()]
  return co
end

P.resume, P.yield = coroutine.resume, coroutine.yield
return P
