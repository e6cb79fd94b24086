-- Neovim (`nvim --headless`, LuaJIT: the pure-Lua backend) with
-- `install()`: vim.schedule and vim.defer_fn run their function in the
-- context of their caller.  Each test runs a script in a fresh nvim; the
-- runtime running these specs only drives it (Lua 5.1 syntax, in every run
-- of spec/25-* and spec/26-*).
local P = require("support.portable")
local H = require("helpers")

local NO_NVIM = not P.has_command("nvim") and "nvim is not installed (Debian: neovim)" or nil

local function root()
  local pwd = io.popen("pwd")
  local dir = pwd:read("*l")
  pwd:close()
  return dir
end

-- The output of `body` run by a fresh headless nvim with the repository's
-- lua/ first on package.path, and the C helper for LuaJIT's ABI
-- (build/purelua/5.1) first on package.cpath; ASYNC_HOOKS_LUVCB=0 reaches
-- nvim, =1 does not (the helper is then optional: the runtime that runs
-- the specs may have its own and 5.1's not be built).  The body sees `ah` (not installed yet), `uv`
-- (vim.uv or vim.loop) and `done(s)`, which prints s and quits; an error
-- in the body is printed as "error: ..."; the run is stopped after 20 s.
local function nvim(body)
  local dir = root()
  local script = H.tmpfile(([[
    package.path = %q .. package.path
    package.cpath = %q .. package.cpath
    local ah = require("async_hooks")
    local uv = vim.uv or vim.loop
    local function done(s)
      io.stdout:write(s, "\n")
      vim.cmd("qa!")
    end
    local ok, e = pcall(function()
  ]]):format(dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;", dir .. "/build/purelua/5.1/?.so;") .. body .. [[

    end)
    if not ok then done("error: " .. tostring(e)) end
  ]])
  -- (nvim runs without the sanitizer runtime an ASan run preloads: its
  -- own allocations are not this project's to check)
  local helper = os.getenv("ASYNC_HOOKS_LUVCB") == "0" and "" or " -u ASYNC_HOOKS_LUVCB"
  local p = io.popen("env -u LD_PRELOAD -u LUA_CPATH -u LUA_CPATH_5_1" .. helper
    .. " timeout 20 nvim --headless -u NONE -c 'luafile " .. script
    .. "' 2>&1 </dev/null")
  local out = p:read("*a")
  p:close()
  os.remove(script)
  return out
end

describe("Neovim's vim.schedule and vim.defer_fn (nvim --headless)", function()
  it("a value set in a coroutine, a luv callback or run reaches fn; a set in fn stays in it", function()
    if NO_NVIM then pending(NO_NVIM); return end
    local out = nvim([[
      ah.install()
      local v = ah.AsyncLocal.new { default = "-" }
      local got = {}
      local function note(name)
        return function()
          got[#got + 1] = name .. "=" .. v:get()
          v:set("dirty")
        end
      end
      -- six registrations made in turn from three contexts
      local co = coroutine.wrap(function()
        v:set("co")
        vim.schedule(note("co schedule"))
        coroutine.yield()
        vim.defer_fn(note("co defer"), 2)
      end)
      co()
      v:run("run", function()
        vim.schedule(note("run schedule"))
        co() -- (the coroutine's context: its own, not the resumer's)
        vim.defer_fn(note("run defer"), 1)
      end)
      local t = uv.new_timer()
      v:run("timer", function()
        t:start(1, 0, function()
          v:set("luv")
          vim.schedule(note("luv schedule"))
          vim.defer_fn(note("luv defer"), 1)
          t:close()
        end)
      end)
      v:set("main") -- the main thread's value when the callbacks run
      vim.wait(5000, function() return #got == 6 end)
      table.sort(got)
      done(table.concat(got, ",") .. "; main=" .. v:get())
    ]])
    assert.equal("co defer=co,co schedule=co,luv defer=luv,luv schedule=luv,"
      .. "run defer=run,run schedule=run; main=main\n", out)
  end)

  it("scheduled from the root: the empty context, whatever runs when Neovim calls fn", function()
    if NO_NVIM then pending(NO_NVIM); return end
    local out = nvim([[
      ah.install()
      local v = ah.AsyncLocal.new { default = "-" }
      local got = {}
      vim.schedule(function() got[#got + 1] = "schedule=" .. v:get(); v:set("dirty") end)
      vim.defer_fn(function() got[#got + 1] = "defer=" .. v:get(); v:set("dirty") end, 1)
      v:run("waiting", function()
        vim.wait(5000, function() return #got == 2 end)
      end)
      v:set("main")
      -- from Neovim's main loop, after this chunk returned
      vim.schedule(function()
        got[#got + 1] = "loop=" .. v:get()
        vim.defer_fn(function()
          got[#got + 1] = "loop defer=" .. v:get()
          done(table.concat(got, ","))
        end, 1)
      end)
    ]])
    assert.equal("schedule=-,defer=-,loop=main,loop defer=main\n", out)
  end)

  it("work that must not inherit: Snapshot.empty():run, AsyncLocalStorage:exit", function()
    if NO_NVIM then pending(NO_NVIM); return end
    local out = nvim([[
      ah.install()
      local v = ah.AsyncLocal.new { default = "-" }
      local store = ah.AsyncLocalStorage.new()
      v:set("main")
      local got = {}
      local function note(name)
        return function()
          got[#got + 1] = name .. "=" .. v:get() .. "/" .. tostring(store:getStore())
        end
      end
      v:run("req", function()
        store:run("s", function()
          ah.Snapshot.empty():run(vim.schedule, note("empty schedule"))
          ah.Snapshot.empty():run(vim.defer_fn, note("empty defer"), 1)
          store:exit(vim.schedule, note("exit schedule"))
          vim.schedule(note("inherits"))
        end)
      end)
      vim.wait(5000, function() return #got == 4 end)
      table.sort(got)
      done(table.concat(got, ","))
    ]])
    assert.equal("empty defer=-/nil,empty schedule=-/nil,exit schedule=req/nil,inherits=req/s\n", out)
  end)

  it("a resource as a luv request: init at the call, before/after around fn, then destroy", function()
    if NO_NVIM then pending(NO_NVIM); return end
    local out = nvim([[
      ah.install()
      local log, types = {}, {}
      local caller, trig, id, res
      ah.createHook {
        init = function(i, t, tr) types[i] = t; if t == "vim.schedule" and id == nil then trig = tr; id = i end
          log[#log + 1] = "init " .. t end,
        before = function(i) log[#log + 1] = "before " .. types[i] end,
        after = function(i) log[#log + 1] = "after " .. types[i] end,
        destroy = function(i) log[#log + 1] = "destroy " .. types[i] end,
      }:enable()
      local ran = false
      ah.AsyncResource.new("Req"):runInAsyncScope(function()
        caller = ah.executionAsyncId()
        vim.schedule(function()
          ran = ah.executionAsyncId() == id and ah.triggerAsyncId() == caller
          res = ah.executionAsyncResource().op
        end)
      end)
      vim.wait(5000, function() return res ~= nil end)
      local first = table.concat(log, ",")
      log = {}
      vim.defer_fn(function() end, 1)
      vim.wait(5000, function() return #log >= 8 end)
      done(first .. "; " .. tostring(trig == caller) .. " " .. tostring(ran) .. " " .. res
        .. "; " .. table.concat(log, ","))
    ]])
    assert.equal("init Req,before Req,init vim.schedule,after Req,"
      .. "before vim.schedule,after vim.schedule,destroy vim.schedule; true true vim.schedule; "
      .. "init uv_timer,before uv_timer,init vim.schedule,after uv_timer,"
      .. "before vim.schedule,after vim.schedule,destroy uv_timer,destroy vim.schedule\n", out)
  end)

  it("argument errors are Neovim's own, word for word", function()
    if NO_NVIM then pending(NO_NVIM); return end
    local out = nvim([[
      local callable = setmetatable({}, { __call = function() end })
      local function errors()
        local t = {}
        for _, f in ipairs {
          function() vim.schedule(5) end,
          function() vim.schedule() end,
          function() vim.schedule(callable) end,
          function() vim.defer_fn(5, 1) end,
          function() vim.defer_fn(function() end, "x") end,
        } do
          local ok, e = pcall(f)
          t[#t + 1] = tostring(ok) .. " " .. tostring(e)
        end
        return table.concat(t, "\n")
      end
      local schedule = vim.schedule
      local before = errors()
      ah.install()
      local after = errors()
      done(tostring(vim.schedule ~= schedule) .. " " .. tostring(before == after) .. "\n" .. after)
    ]])
    -- (Neovim 0.7's messages: "vim.schedule: expected function" three
    -- times, then vim.validate's and luv's, at _editor.lua's lines)
    local first, rest = out:match("^([^\n]*)\n(.*)$")
    assert.equal("true true", first)
    local _, failures = rest:gsub("false [^\n]+\n", "")
    assert.equal(5, failures, rest)
  end)

  it("uninstall() puts the originals back; install() again replaces vim.schedule once", function()
    if NO_NVIM then pending(NO_NVIM); return end
    local out = nvim([[
      local schedule, defer_fn = vim.schedule, vim.defer_fn
      ah.install()
      local replaced = vim.schedule ~= schedule
      local w = vim.schedule
      ah.install() -- (installed already: the same function)
      local once = vim.schedule == w
      ah.uninstall()
      local restored = vim.schedule == schedule and vim.defer_fn == defer_fn
      ah.install()
      local again = vim.schedule ~= schedule
      ah.uninstall()
      -- uninstalled: fn runs in whatever context is current then
      local v = ah.AsyncLocal.new { default = "-" }
      local seen
      v:run("caller", function() vim.schedule(function() seen = v:get() end) end)
      v:run("waiting", function() vim.wait(5000, function() return seen ~= nil end) end)
      done(table.concat({ tostring(replaced), tostring(once), tostring(restored), tostring(again), seen }, " "))
    ]])
    assert.equal("true true true true waiting\n", out)
  end)

  it("an error in a vim.uv callback: Neovim prints what it prints without the library", function()
    if NO_NVIM then pending(NO_NVIM); return end
    -- (the same script with and without install(); with the C helper the
    -- output is the same byte for byte, without it the message is and the
    -- traceback starts at the library's rethrow)
    local function run(install)
      -- (each run's script has a name of its own)
      return (nvim(install .. [[
        local function fail(x) error("boom " .. x) end
        local t = uv.new_timer()
        t:start(1, 0, function() t:close(); fail(1) end)
        vim.wait(200, function() return false end)
        done("after " .. tostring(package.loaded["async_hooks.luvcb"] ~= nil))
      ]]):gsub("/tmp/lua_%w+", "script"))
    end
    local without = run("")
    local with = run("ah.install()")
    local helper = with:match("after (%a+)\n$") == "true"
    assert.matches("Error executing luv callback:\r?\n[^\n]*: boom 1\r?\nstack traceback:", without)
    assert.matches("in function 'fail'", without)
    if helper or os.getenv("ASYNC_HOOKS_LUVCB") == "1" then
      assert.equal(without:gsub("after false", "after true"), with)
    else
      local head = "^(.-stack traceback:)"
      assert.equal(without:match(head), with:match(head))
    end
  end)
end)
