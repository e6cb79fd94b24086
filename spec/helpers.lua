-- Shared helpers for the specs.
local H = {}

-- luv keeps its loop in the first luv module table (its `_loop`); busted
-- empties package.loaded after each spec file, and once that table is
-- collected luv closes the loop that every later require("luv") reuses:
-- the next spec file that uses luv crashes.  Kept for the whole run.
do
  local uv = package.loaded.luv
  local loop = type(uv) == "table" and rawget(uv, "_loop")
  if loop then debug.getregistry()["async_hooks.spec.luv_loop"] = loop end
end

--- The command of the Lua interpreter running these specs (busted's own
-- `arg`: the interpreter is its most negative index, e.g. `lua5.4` for
-- `lua5.4 /usr/bin/busted`), quoted for the shell.
function H.lua_cmd()
  local i = -1
  while arg and arg[i - 1] do i = i - 1 end
  local lua = assert(arg and arg[i], "no interpreter in arg[]")
  return "'" .. lua:gsub("'", "'\\''") .. "'"
end

--- Run a Lua snippet in a fresh process of the running interpreter, with the
-- same module paths.
-- @return exit status, stdout, stderr
function H.run_lua(code)
  local path = H.tmpfile(code)
  local out, err = path .. ".out", path .. ".err"
  -- the subprocess exits without lua_close on purpose: no leak report
  local cmd = ("ASAN_OPTIONS=detect_leaks=0 %s %s >%s 2>%s"):format(H.lua_cmd(), path, out, err)
  local ok, how, status = os.execute(cmd)
  if type(ok) == "number" then -- Lua 5.1 and LuaJIT: the wait status
    how, status = "exit", ok >= 256 and math.floor(ok / 256) or ok
  end
  local function slurp(p)
    local h = io.open(p)
    local s = h and h:read("*a") or ""
    if h then h:close() end
    os.remove(p)
    return s
  end
  os.remove(path)
  local code_ = (how == "exit") and status or -1
  return code_, slurp(out), slurp(err), ok
end

-- the lines of s (a last line without its newline included)
local function lines_of(s)
  local t = {}
  for line in s:gmatch("([^\n]*)\n") do t[#t + 1] = line end
  local rest = s:match("[^\n]*$")
  if rest ~= "" then t[#t + 1] = rest end
  return t
end

local function fields_of(line)
  local t = {}
  for f in (line .. "\t"):gmatch("([^\t]*)\t") do t[#t + 1] = f end
  return t
end

-- expected: a string, or a list of lines, each a string or a list of
-- fields, "name: value" or a bare value; returns the text and, per line,
-- the field names
local function expected_text(expected)
  if type(expected) == "string" then return expected, {} end
  local lines, names = {}, {}
  for i, line in ipairs(expected) do
    if type(line) == "table" then
      local values = {}
      names[i] = {}
      for j, field in ipairs(line) do
        field = tostring(field)
        local name, value = field:match("^(.-): (.*)$")
        names[i][j], values[j] = name, value or field
      end
      lines[i] = table.concat(values, "\t")
    else
      lines[i] = line
    end
  end
  return table.concat(lines, "\n") .. "\n", names
end

-- where stdout `out` first differs from `want`
local function first_difference(out, want, names)
  local got, exp = lines_of(out), lines_of(want)
  for i = 1, math.max(#got, #exp) do
    local g, e = got[i], exp[i]
    if g ~= e then
      local msg = ("stdout line %d differs"):format(i)
      if g and e then
        local gf, ef = fields_of(g), fields_of(e)
        for j = 1, math.max(#gf, #ef) do
          if gf[j] ~= ef[j] then
            local name = names[i] and names[i][j]
            msg = msg .. (", field %d%s: expected %s, got %s"):format(j, name and (" (" .. name .. ")") or "",
              ef[j] and ('"' .. ef[j] .. '"') or "no field", gf[j] and ('"' .. gf[j] .. '"') or "no field")
            break
          end
        end
      end
      return ("%s\n  expected line: %s\n  actual line:   %s"):format(msg,
        e and ('"' .. e .. '"') or "(none)", g and ('"' .. g .. '"') or "(none)")
    end
  end
  return "stdout differs in its last newline"
end

--- Run a Lua snippet in a fresh process (`H.run_lua`) and check that it
-- writes nothing to stderr, exits with status 0 and prints `expected`:
-- the whole stdout as a string, or a list with one entry per line, each a
-- string (the whole line) or a list of fields (the line's tab-separated
-- values, each `"name: value"`, named for the message, or a bare value).
-- A mismatch names the first line (and field) that differs, with both
-- lines and the child's stderr; `what` (optional) prefixes the message.
-- With `expected` nil, stdout is not checked.
-- @return the child's stdout
function H.lua_ok(code, expected, what)
  local status, out, err = H.run_lua(code)
  local stdout = H.child_ok(expected, status, out, err, what, 3) -- (no tail call: the level counts this frame)
  return stdout
end

--- The check of `H.lua_ok` on a child run some other way:
-- `H.child_ok(expected, run(...))` with `run` returning the exit status,
-- stdout and stderr.
-- @return the child's stdout
function H.child_ok(expected, status, out, err, what, level)
  if type(what) ~= "string" then what = nil end
  local want, names
  if expected ~= nil then want, names = expected_text(expected) end
  local problem
  if err ~= "" or status ~= 0 then
    problem = ("the child exited with status %s and wrote to stderr:\n%s"):format(tostring(status), err)
  elseif want and out ~= want then
    problem = first_difference(out, want, names) .. "\n  child's stderr: (empty)"
  end
  if problem then
    local full = ("%s\n--- child's stdout:\n%s"):format(problem, out)
    if what then full = what .. ": " .. full end
    require("busted").fail(full, level or 2)
  end
  return out
end

--- A hook that records events as strings in `log`.
function H.recorder(ah, filter)
  local log = {}
  local function keep(id) return filter == nil or filter[id] end
  local hook = ah.createHook {
    init = function(id, type, trigger, resource)
      if filter then filter[id] = filter[id] or filter.all end
      if keep(id) then log[#log + 1] = ("init %d %s %d"):format(id, type, trigger) end
    end,
    before = function(id) if keep(id) then log[#log + 1] = "before " .. id end end,
    after = function(id) if keep(id) then log[#log + 1] = "after " .. id end end,
    destroy = function(id) if keep(id) then log[#log + 1] = "destroy " .. id end end,
  }
  return hook, log
end

--- Hooks a spec enables, disabled again after each test:
-- `local track, untrack = H.hook_tracker(); after_each(untrack)`.
function H.hook_tracker()
  local hooks = {}
  local function track(h) hooks[#hooks + 1] = h; return h end
  local function untrack()
    for _, h in ipairs(hooks) do h:disable() end
    hooks = {}
  end
  return track, untrack
end

--- Inside a `describe`: the library installed before each test and
-- uninstalled after it, once the hooks given to the returned `track` are
-- disabled.
function H.installed_each()
  local ah, busted = require("async_hooks"), require("busted")
  local track, untrack = H.hook_tracker()
  busted.before_each(function() ah.install() end)
  busted.after_each(function()
    untrack()
    ah.uninstall()
  end)
  return track
end

--- The error that `f` raises, after checking that its position is `f`'s
-- own line in the spec file: `f` must be a one-line function that makes the
-- bad call as a statement (not a tail call).
function H.raised_here(f)
  local info = debug.getinfo(f, "S")
  if info.linedefined ~= info.lastlinedefined then error("H.raised_here: one-line function expected", 2) end
  local ok, err = pcall(f)
  if ok then error(("no error raised by the call at line %d"):format(info.linedefined), 2) end
  local where = ("%s:%d: "):format(info.short_src, info.linedefined)
  if type(err) ~= "string" or err:sub(1, #where) ~= where then
    error(("error not positioned at the caller's line %s: %s"):format(where, tostring(err)), 2)
  end
  return err:sub(#where + 1)
end

--- A temporary file holding `content`; returns its path.
function H.tmpfile(content)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(content)
  f:close()
  return path
end

--- Run f with no collection at all: the collector stopped and the GC
-- stress runs' step hook (spec/support/gcstress.lua) off, for checks that
-- count what the next collection would change.  Coroutines created inside
-- f do not get the hook.
function H.no_gc(f, ...)
  local hook, mask, count = debug.gethook()
  local running = collectgarbage("isrunning")
  debug.sethook()
  collectgarbage("stop")
  local ok, err = pcall(f, ...)
  if running then collectgarbage("restart") end
  if hook then debug.sethook(hook, mask, count) end
  if not ok then error(err, 0) end
end

--- Full garbage collection, twice (finalizers, then what they freed).
function H.gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

return H
