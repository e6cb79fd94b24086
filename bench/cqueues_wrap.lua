--- The cost of one cq:wrap thread (made, run to completion, collected):
--   lua5.4 bench/cqueues_wrap.lua <variant> <n> [args]
-- variant "plain" (cqueues alone), "loaded" (the library loaded, not
-- installed), "installed", "value" (installed, an AsyncLocal set around
-- the wraps); args: how many arguments each wrap passes (0 or 2).
-- Under callgrind, (count(2n) - count(n)) / n is the cost per thread; with
-- BENCH_WALL=1 it prints the CPU time per thread (os.clock) instead.
local variant, n, nargs = arg[1], tonumber(arg[2]), tonumber(arg[3] or 0)
local ah
if variant ~= "plain" then ah = require("async_hooks") end
if variant == "installed" or variant == "value" then ah.install() end
local cqueues = require("cqueues")
local cq = cqueues.new()
local done = 0
local function body() done = done + 1 end
-- a server's shape: a few threads at a time (BATCH), each run to its end
local BATCH = tonumber(os.getenv("BENCH_BATCH") or 10)
local function spawn()
  for _ = 1, n // BATCH do
    for _ = 1, BATCH do
      if nargs == 0 then cq:wrap(body) else cq:wrap(body, 1, 2) end
    end
    assert(cq:loop())
  end
end
local t0 = os.clock()
if variant == "value" then ah.AsyncLocal.new():run("v", spawn) else spawn() end
local t = os.clock() - t0
assert(done == n)
if os.getenv("BENCH_WALL") then print(("%.3f us per thread"):format(t / n * 1e6)) end
