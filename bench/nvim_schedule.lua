--- The cost of vim.schedule with the library, in headless Neovim:
--   nvim --headless -u NONE -c 'luafile bench/nvim_schedule.lua' [-- rounds]
-- Each round times N calls of vim.schedule (os.clock) and then the
-- loop running them (vim.wait), three ways in turn: the library
-- uninstalled (Neovim's own vim.schedule), installed with nothing to carry
-- (called from the root: no value, no hook), installed with a value set.
-- Prints the median ns per call of each, and the median of the rounds'
-- paired ratios of call + run to the raw one.
-- luacheck: read globals vim jit
local here = debug.getinfo(1, "S").source:match("^@(.*)bench/[^/]*$") or "./"
package.path = here .. "lua/?.lua;" .. here .. "lua/?/init.lua;" .. here .. "bench/?.lua;" .. package.path
local median = require("stats").median
local ah = require("async_hooks")

local N = 10000
local ROUNDS = tonumber(vim.v.argv[#vim.v.argv]) or 9
local v = ah.AsyncLocal.new()

local ran = 0
local function fn() ran = ran + 1 end

-- ns per call of scheduling N, then of running them
local function round()
  ran = 0
  local t0 = os.clock()
  for _ = 1, N do vim.schedule(fn) end
  local t1 = os.clock()
  vim.wait(10000, function() return ran == N end, 1)
  local t2 = os.clock()
  assert(ran == N)
  return (t1 - t0) * 1e9 / N, (t2 - t1) * 1e9 / N
end

local CASES = {
  { "raw", function() ah.uninstall(); return round() end },
  { "installed, root", function() ah.install(); return round() end },
  { "installed, value set", function() ah.install(); return v:run("x", round) end },
}

local call, run = {}, {}
for _, c in ipairs(CASES) do call[c[1]], run[c[1]] = {}, {} end
round() -- (warm-up)
for _ = 1, ROUNDS do
  for _, c in ipairs(CASES) do
    local a, b = c[2]()
    local t = call[c[1]]
    t[#t + 1] = a
    t = run[c[1]]
    t[#t + 1] = b
  end
end
ah.uninstall()

local out = { ("vim.schedule, %d calls, median of %d rounds (%s)"):format(N, ROUNDS, jit and jit.version or _VERSION) }
for _, c in ipairs(CASES) do
  local name = c[1]
  local ratio = {}
  for r = 1, ROUNDS do
    ratio[r] = (call[name][r] + run[name][r]) / (call.raw[r] + run.raw[r])
  end
  out[#out + 1] = ("%-22s call %5.0f ns  run %5.0f ns  (call + run: %.2fx)"):format(name,
    median(call[name]), median(run[name]), median(ratio))
end
io.stdout:write(table.concat(out, "\n"), "\n")
vim.cmd("qa!")
