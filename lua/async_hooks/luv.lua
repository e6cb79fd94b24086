--- luv integration: every callback handed to luv runs in the context of the
-- call that handed it over.
--
-- Patches the luv module table and the `__index` table of every luv
-- metatable (so `uv.timer_start(t, ...)` and `t:start(...)` are both
-- covered) with C wrappers made by `core.luv_wrap`, and swaps luv's
-- `cb_pcall` for the library's (see `src/luv/`).  Used by
-- `async_hooks.install()`; not meant to be required on its own.
-- @module async_hooks.luv
local core = require("async_hooks.core")
local specs = require("async_hooks.luv_specs")

local pairs, ipairs, type, rawget = pairs, ipairs, type, rawget
-- (see async_hooks.luv_specs)
local SPECS = specs.SPECS

local M = {}

--- The names of the luv functions that are wrapped, sorted: every one the
-- library knows until luv is attached, then only those that luv has (the
-- table is filtered in place).
M.covered = specs.names()

--- Patch luv (idempotent).  The wrappers are made once per Lua state and
-- kept in `persist` (each anchors its spec for the life of the state: an
-- install/uninstall cycle makes none); a luv module table required again
-- (a new table, and luv's new `__index` tables) is patched when `attach` is
-- called with it.
-- @param uv the luv module table
-- @param persist the table that survives re-requires of the module
function M.attach(uv, persist)
  local state = persist.luv
  if state and state.uvs[uv] then return end
  local wrappers = persist.luv_wrappers -- original -> wrapper
  if not wrappers then
    wrappers = {}
    persist.luv_wrappers = wrappers
  end
  for _, s in ipairs(SPECS) do
    local orig = rawget(uv, s[1])
    if type(orig) == "function" and not wrappers[orig] then
      wrappers[orig] = core.luv_wrap(orig, {
        op = s[1], pos = s[2], alt = s[3], kind = s[4], type = s[5], fields = s[6],
        slot = s.slot, fn = s.fn,
      })
    end
  end
  -- uv.run itself: callbacks that run inside the library's uv.run find the
  -- core's state in its upvalues (the fast path of src/luv/dispatch.c)
  local run = rawget(uv, "run")
  if type(run) == "function" and not wrappers[run] then wrappers[run] = core.luv_wrap_run(run) end
  state = state or { uvs = {}, patches = {} } -- patches: {{tbl, key, orig}}
  state.uvs[uv] = true
  local function patch(tbl)
    for k, v in pairs(tbl) do
      local w = wrappers[v]
      if w then
        state.patches[#state.patches + 1] = { tbl, k, v }
        tbl[k] = w
      end
    end
  end
  patch(uv)
  local j = 0
  for i = 1, #M.covered do
    local name = M.covered[i]
    M.covered[i] = nil
    if type(rawget(uv, name)) == "function" then j = j + 1; M.covered[j] = name end
  end
  -- every luv metatable: handles (uv_timer, uv_tcp, ...), uv_dir, ...
  for k, mt in pairs(debug.getregistry()) do
    if type(k) == "string" and k:match("^uv_") and type(mt) == "table" then
      local index = rawget(mt, "__index")
      if type(index) == "table" then patch(index) end
    end
  end
  core.luv_attach(rawget(uv, "walk"), rawget(uv, "is_closing"))
  -- queued destroys: every callback's exit delivers them, and so does the
  -- library's uv.run when it starts (src/luv/dispatch.c), so they arrive at
  -- the latest on the next loop iteration without a handle that runs every
  -- iteration.
  persist.luv = state
end

--- Undo `attach`: every patched slot gets its original function back.  Runs
-- no user code.
-- @param persist the table given to `attach`
function M.detach(persist)
  local state = persist.luv
  if not state then return end
  for i = #state.patches, 1, -1 do
    local p = state.patches[i]
    p[1][p[2]] = p[3]
  end
  core.luv_detach()
  persist.luv = nil
end

return M
