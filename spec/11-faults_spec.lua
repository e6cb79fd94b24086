-- Fault injection (tests/failalloc.c): every growing allocation of a
-- workload that touches every C entry point fails in turn, in a fresh
-- lua_State per run; the library must raise a Lua error (or let one
-- through) and leave its state usable.  Under `make asan` the harness is
-- built with the sanitizers too, and the core-only run checks for leaks.

local H = require("helpers")

-- the output of a command that must succeed, trailing space trimmed
local function capture(cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  assert(ok, cmd .. " failed: " .. out)
  return (out:gsub("%s+$", ""))
end

-- compile tests/<name>.c into a temporary executable (with the sanitizers
-- under `make asan`, like the module it loads)
local function build(name)
  local exe = os.tmpname()
  -- Lua's headers and library: pkg-config, else LuaRocks' configuration
  local cflags, libs = capture("./.ci/lua-flags --cflags"), capture("./.ci/lua-flags --libs")
  -- the sanitizer flags of `make asan` (AH_SAN_FLAGS), so that the harness
  -- is built as the module is
  local san = os.getenv("AH_ASAN") and (os.getenv("AH_SAN_FLAGS") or "") or ""
  local cmd = ("env -u LD_PRELOAD gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O1 -g %s %s tests/%s.c -o %s %s -lm 2>&1")
    :format(san, cflags, name, exe, libs)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  assert(ok, "building tests/" .. name .. ".c failed: " .. out)
  return exe
end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return ok == true, out
end

local function run(exe, luv, leaks, script, extra, seeing, once)
  return sh(("AH_FAULTS_LUV=%d AH_FAULTS_HOSTEXTRA=%d AH_FAULTS_SEEING=%d AH_FAULTS_ONCE=%d ASAN_OPTIONS=detect_leaks=%d %s %s 5000")
    :format(luv, extra or 0, seeing or 0, once or 0, leaks, exe, script or "tests/faults.lua"))
end

describe("fault injection #slow", function()
  local exe
  setup(function() exe = build("failalloc") end)
  teardown(function() if exe then os.remove(exe) end end)

  for _, case in ipairs {
    { "the core (leaks checked under ASan)", 0, 1 },
    { "the core with luv", 1, 0 },
    { "the core in a host that owns LUA_EXTRASPACE", 0, 1, 1 },
    -- the init hook takes its resource: resources made for init (the
    -- cases above make none until asked for)
    { "the core, an init hook that sees its resource (leaks checked)", 0, 1, 0, 1 },
    { "the core with luv, an init hook that sees its resource", 1, 0, 0, 1 },
  } do
    it("failing allocations in " .. case[1] .. ": an error and intact state, never a crash", function()
      local ok, out = run(exe, case[2], case[3], nil, case[4], case[5])
      print("\n  " .. (out:match("fault injection: [^\n]+") or out))
      assert.is_true(ok, out)
      local points, failed = out:match("fault injection: (%d+) allocation points, .-(%d+) failed")
      assert.truthy(points, out)
      assert.equal("0", failed)
      assert.is_true(tonumber(points) > 50, "allocation points: " .. points)
    end)
  end

  -- hooks that allocate: the failing allocation lands inside hook calls,
  -- where it is not the hook's own error: never an exit, always an error
  -- from the operation, and the library as it was (tests/faults_hooks.lua)
  for _, luv in ipairs { 0, 1 } do
    for _, once in ipairs { 0, 1 } do
      local how = (once == 1 and "fails once (then memory is back)" or "fails from then on") ..
        (luv == 1 and ", luv callbacks too" or "")
      it("an allocation inside a hook that " .. how .. ": a catchable error and a consistent library", function()
        local ok, out = run(exe, luv, 1 - luv, "tests/faults_hooks.lua", 0, 0, once)
        print("\n  " .. (out:match("fault injection: [^\n]+") or out))
        assert.is_true(ok, out)
        local points, errors, fatal, failed =
          out:match("fault injection: (%d+) allocation points, (%d+) runs raised .-(%d+) ended .-(%d+) failed")
        assert.truthy(points, out)
        assert.equal("0", fatal, out)
        assert.equal("0", failed, out)
        assert.is_true(tonumber(points) > 100, "allocation points: " .. points)
        -- every one an error, but for a failure inside coroutine.close's
        -- stack shrink (which Lua ignores) and inside luv callbacks (which
        -- luv reports, told not to exit)
        if luv == 0 then assert.is_true(tonumber(errors) >= tonumber(points) - 4, out) end
      end)
    end
  end

  it("a hook change that fails inside a hook, after another change there, leaves dispatch working", function()
    local ok, out = run(exe, 0, 0, "tests/faults_hook_change.lua")
    assert.is_true(ok, out)
    local points, failed = out:match("fault injection: (%d+) allocation points, .-(%d+) failed")
    assert.truthy(points, out)
    assert.equal("0", failed, out)
    assert.is_true(tonumber(points) > 5, "allocation points: " .. points)
  end)

  -- the harness itself: a workload whose state check fails must be reported
  it("reports a workload that leaves a broken state", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
      local t
      return {
        setup = function() t = {} end,
        work = function() for i = 1, 100 do t[i] = { i } end end,
        check = function() error("state broken") end,
      }
    ]])
    f:close()
    local ok, out = run(exe, 0, 0, script)
    os.remove(script)
    assert.is_false(ok, out)
    local failed = out:match("fault injection: %d+ allocation points, .-(%d+) failed")
    assert.truthy(failed, out)
    assert.is_true(tonumber(failed) > 0, out)
    assert.matches("state not intact", out)
  end)
end)

-- the manual reserves LUA_EXTRASPACE for the host: a host that uses it
-- declares it (registry field async_hooks.host_extraspace)
describe("a host that uses LUA_EXTRASPACE #slow", function()
  local exe
  setup(function() exe = build("extrahost") end)
  teardown(function() if exe then os.remove(exe) end end)

  it("keeps its bytes once declared: the module looks threads up instead", function()
    local ok, out = sh(exe .. " host tests/extrahost.lua")
    assert.is_true(ok, out)
    assert.matches("extraspace in use: false", out)
    assert.matches("extrahost host: ok", out)
  end)

  -- review finding 4: the fallback lookup's one-entry cache
  it("gives a new thread at a collected thread's address a fresh context", function()
    for _, mode in ipairs { "host", "none" } do
      local ok, out = sh(exe .. " " .. mode .. " tests/extrahost_aba.lua")
      assert.is_true(ok, out)
      assert.matches("wrong context in 0 of 2000", out)
      assert.matches("extrahost aba: ok", out)
    end
  end)

  it("gives back the slot of a coroutine resurrected and finished by a finalizer", function()
    for _, mode in ipairs { "host", "none" } do
      local ok, out = sh(exe .. " " .. mode .. " tests/extrahost_resurrect.lua")
      assert.is_true(ok, out)
      assert.matches("extrahost resurrect: ok", out)
    end
  end)

  it("leaves the extra space to the module when the host declares nothing, whatever its bytes", function()
    local ok, out = sh(exe .. " none tests/extrahost.lua")
    assert.is_true(ok, out)
    assert.matches("extraspace in use: true", out)
    assert.matches("extrahost none: ok", out)
  end)
end)

-- ownership of LUA_EXTRASPACE does not depend on bytes Lua leaves
-- uninitialized: the same in every state, and no read of them
describe("LUA_EXTRASPACE ownership #slow", function()
  local SCRIPT = [==[
local uv = require("luv")
local ah = require("async_hooks").install()
local owned = { require("async_hooks.core").stats().extraspace }
local results, threads = {}, {}
for i = 1, 8 do -- an async handle each: sends to one handle coalesce
  local async
  async = uv.new_async(function(owns)
    results[i] = tostring(owns)
    async:close()
  end)
  threads[i] = uv.new_thread(function(done)
    local a = require("async_hooks").install()
    local v = a.AsyncLocal.new()
    v:set(1)
    local c = coroutine.create(function() coroutine.yield(v:get()) end)
    local _, got = coroutine.resume(c)
    assert(got == 1)
    done:send(require("async_hooks.core").stats().extraspace)
  end, async)
end
uv.run()
for i = 1, 8 do threads[i]:join() end
print(owned[1], table.concat(results, " "))
]==]

  it("is the module's in the main state and in uv.new_thread states", function()
    H.lua_ok(SCRIPT, { { "owned in the main state: true", "owned in each thread's: " .. ("true "):rep(7) .. "true" } })
  end)

  it("is decided without reading uninitialized memory (valgrind, no suppression)", function()
    if os.execute("command -v valgrind >/dev/null 2>&1") ~= true then
      pending("valgrind is not installed")
      return
    end
    if os.getenv("AH_ASAN") or os.getenv("AH_VALGRIND") then
      pending("a sanitizer build, or valgrind already: the plain build's runs check it")
      return
    end
    local path = H.tmpfile(SCRIPT)
    local p = io.popen(("valgrind -q --error-exitcode=9 %s %s 2>&1; echo \"rc=$?\""):format(H.lua_cmd(), path))
    local out = p:read("a")
    p:close()
    os.remove(path)
    assert.matches("rc=0", out)
    assert.is_nil(out:match("uninitialised"), out)
  end)
end)
