-- Fault injection (tests/failalloc.c): every growing allocation of a
-- workload that touches every C entry point fails in turn, in a fresh
-- lua_State per run; the library must raise a Lua error (or let one
-- through) and leave its state usable.  Under `make asan` the harness is
-- built with the sanitizers too, and the core-only run checks for leaks.
local H = require("helpers")

local function sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  assert(ok, cmd .. " failed: " .. out)
  return (out:gsub("%s+$", ""))
end

local function build()
  local exe = os.tmpname()
  -- Lua's headers and library: pkg-config, else LuaRocks' configuration
  local cflags, libs = sh("./.ci/lua-flags --cflags"), sh("./.ci/lua-flags --libs")
  local san = os.getenv("AH_ASAN") and "-fsanitize=address,undefined -fno-sanitize-recover=undefined" or ""
  local cmd = ("env -u LD_PRELOAD gcc -std=c99 -O1 -g %s %s tests/failalloc.c -o %s %s -lm 2>&1")
    :format(san, cflags, exe, libs)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  assert(ok, "building the harness failed: " .. out)
  return exe
end

local function run(exe, luv, leaks)
  local p = io.popen(("AH_FAULTS_LUV=%d ASAN_OPTIONS=detect_leaks=%d %s tests/faults.lua 5000 2>&1")
    :format(luv, leaks, exe))
  local out = p:read("a")
  local ok = p:close()
  return ok, out
end

describe("fault injection #slow", function()
  local exe
  setup(function() exe = build() end)
  teardown(function() if exe then os.remove(exe) end end)

  for _, case in ipairs { { "the core (leaks checked under ASan)", 0, 1 }, { "the core with luv", 1, 0 } } do
    it("failing allocations in " .. case[1] .. ": an error and intact state, never a crash", function()
      local ok, out = run(exe, case[2], case[3])
      print("\n  " .. (out:match("fault injection: [^\n]+") or out))
      assert.is_true(ok, out)
      local points, failed = out:match("fault injection: (%d+) allocation points, .-(%d+) failed")
      assert.truthy(points, out)
      assert.equal("0", failed)
      assert.is_true(tonumber(points) > 50, "allocation points: " .. points)
    end)
  end
  assert(H)
end)
