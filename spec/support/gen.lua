--- Seeded random programs for the differential test, and the interpreter
-- that runs one against an implementation (the model or the real library),
-- returning the trace of observations.

-- On LuaJIT this file runs interpreted (its functions and the ones made in
-- them): LuaJIT 2.1 builds older than mid-2023, Debian 12's among them,
-- miscompile a side trace that runs from this interpreter's loop into the
-- library's code, and a live stack slot of the program then holds a wrong
-- value (docs/purelua.md, "A LuaJIT bug").  The library's own code
-- stays compiled, so the test checks the library, not that bug.
do
  local jit = rawget(_G, "jit")
  if jit then jit.off(true, true) end
end

local G = {}

local NLOCALS = 3

-- xorshift's step on 32-bit unsigned integers: Lua 5.3's operators, else
-- LuaJIT's `bit` or Lua 5.2's `bit32` (loaded from a string: the operators
-- do not parse before 5.3)
local xorshift
do
  local bitlib = rawget(_G, "bit") or rawget(_G, "bit32")
  if not bitlib then
    local ok, b = pcall(require, "bit32")
    if ok then bitlib = b end
  end
  local native = _VERSION >= "Lua 5.3" and load([[
    return function(x)
      x = x ~ (x << 13) & 0xffffffff
      x = x ~ (x >> 17)
      return x ~ (x << 5) & 0xffffffff
    end]])
  if native then
    xorshift = native()
  else
    local bxor, lshift, rshift = bitlib.bxor, bitlib.lshift, bitlib.rshift
    local M32 = 4294967296
    xorshift = function(x)
      x = bxor(x, lshift(x, 13)) % M32
      x = bxor(x, rshift(x, 17)) % M32
      return bxor(x, lshift(x, 5)) % M32
    end
  end
end

-- A deterministic PRNG (xorshift), so that a seed means the same program on
-- every machine and Lua build.
local function rng(seed)
  local x = seed * 2654435761 % 4294967296 + 1
  return function(n)
    x = xorshift(x)
    return x % n + 1
  end
end

--- Generate a program: a list of statements.  `ctx` says where the block
-- runs: "main", "co" (may yield), "timer" (may not yield).
function G.program(seed, size)
  local r = rng(seed)
  local nco, nar, nsnap, val = 0, 0, 0, 0
  local function block(ctx, depth, n)
    local out = {}
    for _ = 1, n do
      local k = r(depth >= 3 and 6 or 14)
      local s
      if k <= 2 then s = { op = "obs" }
      elseif k == 3 then val = val + 1; s = { op = "set", i = r(NLOCALS), v = "v" .. val }
      elseif k == 4 then s = { op = "yield" }
      elseif k == 5 then s = { op = "resume", k = r(math.max(nco, 1)) }
      elseif k == 6 then s = { op = "destroy", k = r(math.max(nar, 1)) }
      elseif k == 7 then val = val + 1
        s = { op = "run", i = r(NLOCALS), v = (r(5) == 1) and "nil" or ("v" .. val), body = block(ctx, depth + 1, r(3)) }
      elseif k == 8 then nsnap = nsnap + 1; s = { op = "snap", k = nsnap }
      elseif k == 9 then s = { op = "snaprun", k = r(math.max(nsnap, 1)), body = block(ctx, depth + 1, r(3)) }
      elseif k == 10 then nar = nar + 1; s = { op = "ar", k = nar }
      elseif k == 11 then s = { op = "arrun", k = r(math.max(nar, 1)), body = block(ctx, depth + 1, r(3)) }
      elseif k == 12 then nco = nco + 1; s = { op = "co", k = nco, go = r(3) > 1, body = block("co", depth + 1, r(4)) }
      elseif k == 13 then s = { op = (ctx == "timer") and "obs" or "timer", body = block("timer", depth + 1, r(3)) }
      else s = { op = (r(2) == 1) and "err" or "hook", on = r(2) == 1, body = block(ctx, depth + 1, r(2)) }
      end
      if s.op == "yield" and ctx ~= "co" then s = { op = "obs" } end
      out[#out + 1] = s
    end
    return out
  end
  local prog = block("main", 0, size)
  if seed % 2 == 1 then table.insert(prog, 1, { op = "hook", on = true }) end
  prog[#prog + 1] = { op = "drain" }
  return prog
end

--- Run a program against `impl`; returns the list of observations.
function G.exec(prog, impl)
  local trace = {}
  local cos, ars, snaps = {}, {}, {}
  local keep = {} -- nothing is collected mid-program: GC-driven destroys are not modelled
  local function note(s) trace[#trace + 1] = s end
  local exec
  local function obs()
    local vals = {}
    for i = 1, NLOCALS do vals[i] = tostring(impl.get(i)) end
    note(("obs %s | id %s trig %s"):format(table.concat(vals, ","), tostring(impl.exec_id()),
      tostring(impl.trigger_id())))
  end
  local function body_of(b) return function() exec(b) end end
  function exec(block)
    for _, s in ipairs(block) do
      local op = s.op
      if op == "obs" then obs()
      elseif op == "set" then impl.set(s.i, s.v)
      elseif op == "yield" then impl.yield()
      elseif op == "resume" then if cos[s.k] then note("resume co#" .. s.k .. " " .. tostring(impl.co_resume(cos[s.k]))) end
      elseif op == "destroy" then if ars[s.k] then impl.ar_destroy(ars[s.k]) end
      elseif op == "run" then impl.run(s.i, s.v ~= "nil" and s.v or nil, body_of(s.body)); obs()
      elseif op == "snap" then snaps[s.k] = impl.snap()
      elseif op == "snaprun" then
        snaps[s.k] = snaps[s.k] or impl.snap()
        impl.snaprun(snaps[s.k], body_of(s.body)); obs()
      elseif op == "ar" then ars[s.k] = impl.ar_new(); keep[#keep + 1] = ars[s.k]
      elseif op == "arrun" then
        if not ars[s.k] then ars[s.k] = impl.ar_new(); keep[#keep + 1] = ars[s.k] end
        impl.ar_run(ars[s.k], body_of(s.body)); obs()
      elseif op == "co" then
        cos[s.k] = impl.co_new(body_of(s.body))
        keep[#keep + 1] = cos[s.k]
        if s.go then note("resume co#" .. s.k .. " " .. tostring(impl.co_resume(cos[s.k]))) end
      elseif op == "timer" then impl.timer(body_of(s.body))
      elseif op == "err" then
        local ok = pcall(function() exec(s.body); error("boom", 0) end)
        note("err caught " .. tostring(not ok)); obs()
      elseif op == "hook" then impl.hook(s.on)
      elseif op == "drain" then
        impl.finish()
        local keys = {}
        for k in pairs(cos) do keys[#keys + 1] = k end
        table.sort(keys)
        for _, k in ipairs(keys) do impl.co_resume(cos[k]) end
        impl.finish()
        obs()
      end
    end
  end
  exec(prog)
  impl.hook(false)
  return trace, keep
end

return G
