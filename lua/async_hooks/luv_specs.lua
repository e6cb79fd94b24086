--- The callback-taking luv functions: where each takes its callback, what
-- kind of registration it makes, its resource type and named arguments.
-- Shared by the luv integration of the C core (`async_hooks.luv`) and the
-- pure-Lua backend (`async_hooks.backend.luv_lua`).  Plain Lua 5.1: it
-- loads in every Lua the library runs on.
-- @module async_hooks.luv_specs
local pairs, ipairs, type = pairs, ipairs, type
-- kinds (src/luv/ knows them by these names): a handle's callback, kept
-- until its slot is re-armed or the handle closed; a handle created by the
-- call itself; a close callback; a request (one-shot); new_work's
local K_HANDLE, K_CREATE, K_CLOSE, K_REQ, K_WORK = "handle", "create", "close", "request", "work"

--- Every callback-taking luv function: {name, position, alternative
-- position, kind[, resource type[, named arguments]]}; `fn`: luv takes only
-- a function there.  The alternative position is used when
-- the callback is not at the first one and that argument is nil (fs_read(fd,
-- size, cb) and fs_read(fd, size, offset, cb)).  A start function that
-- takes one handle type names it (luv's checks make it exact; no lookup per
-- init); the others take the type from the handle's metatable (`uv_tcp`,
-- `uv_pipe`, ...).  Every
-- resource has `op` (the name) and `handle` (the first argument when it is a
-- userdata); the named arguments `{field, position, ...}` (at most two) are
-- copied into it too.
local SPECS = {
  -- handle callbacks (kept until the same slot is re-armed or the handle
  -- is closed)
  { "timer_start", 4, 0, K_HANDLE, "uv_timer" },
  { "prepare_start", 2, 0, K_HANDLE, "uv_prepare" },
  { "check_start", 2, 0, K_HANDLE, "uv_check" },
  { "idle_start", 2, 0, K_HANDLE, "uv_idle" },
  { "poll_start", 3, 0, K_HANDLE },
  { "signal_start", 3, 0, K_HANDLE, "uv_signal" },
  { "signal_start_oneshot", 3, 0, K_HANDLE, "uv_signal" },
  { "fs_event_start", 4, 0, K_HANDLE, "uv_fs_event" },
  { "fs_poll_start", 4, 0, K_HANDLE, "uv_fs_poll" },
  { "listen", 3, 0, K_HANDLE },
  { "read_start", 2, 0, K_HANDLE },
  { "udp_recv_start", 2, 0, K_HANDLE },
  -- handles created by the call itself
  { "new_async", 1, 0, K_CREATE, "uv_async", fn = true },
  { "spawn", 3, 0, K_CREATE, "uv_process" },
  -- close callbacks (one-shot; the handle's registrations are destroyed)
  { "close", 2, 0, K_CLOSE },
  { "tcp_close_reset", 2, 0, K_CLOSE },
  -- requests (one-shot)
  { "write", 3, 0, K_REQ, "uv_write" },
  { "write2", 4, 0, K_REQ, "uv_write" },
  { "shutdown", 2, 0, K_REQ, "uv_shutdown" },
  { "tcp_connect", 4, 0, K_REQ, "uv_connect", { "host", 2, "port", 3 } },
  { "pipe_connect", 3, 0, K_REQ, "uv_connect" },
  { "pipe_connect2", 4, 3, K_REQ, "uv_connect" },
  { "udp_send", 5, 0, K_REQ, "uv_udp_send", { "host", 3, "port", 4 } },
  { "getaddrinfo", 4, 0, K_REQ, "uv_getaddrinfo", { "host", 1, "service", 2 } },
  { "getnameinfo", 2, 0, K_REQ, "uv_getnameinfo" },
  { "random", 3, 0, K_REQ, "uv_random" },
  -- the after-work callback of new_work (called once per queue_work)
  { "new_work", 2, 0, K_WORK, "uv_work", fn = true },
}

--- Callback slots of handle registrations: registering again through a
-- function of the same slot replaces the registration.
local SLOT_OF = { signal_start_oneshot = "signal_start" }

local FS = {
  fs_close = 2, fs_open = 4, fs_read = { 4, 3 }, fs_unlink = 2, fs_write = { 4, 3 },
  fs_mkdir = 3, fs_mkdtemp = 2, fs_mkstemp = 2, fs_rmdir = 2, fs_scandir = 2,
  fs_stat = 2, fs_fstat = 2, fs_lstat = 2, fs_rename = 3, fs_fsync = 2,
  fs_fdatasync = 2, fs_ftruncate = 3, fs_sendfile = 5, fs_access = 3, fs_chmod = 3,
  fs_fchmod = 3, fs_utime = 4, fs_futime = 4, fs_lutime = 4, fs_link = 3,
  fs_symlink = { 4, 3 }, fs_readlink = 2, fs_realpath = 2, fs_chown = 4,
  fs_fchown = 4, fs_lchown = { 4, 3 }, fs_copyfile = { 4, 3 }, fs_opendir = 2,
  fs_readdir = 2, fs_closedir = 2, fs_statfs = 2,
}
-- fs calls whose first argument is a path (the others take an fd or a
-- uv_dir); the second path of a two-path call is `new_path`
local PATH = {
  fs_open = 1, fs_unlink = 1, fs_mkdir = 1, fs_mkdtemp = 1, fs_mkstemp = 1,
  fs_rmdir = 1, fs_scandir = 1, fs_stat = 1, fs_lstat = 1, fs_rename = 2,
  fs_access = 1, fs_chmod = 1, fs_utime = 1, fs_lutime = 1, fs_link = 2,
  fs_symlink = 2, fs_readlink = 1, fs_realpath = 1, fs_chown = 1, fs_lchown = 1,
  fs_copyfile = 2, fs_opendir = 1, fs_statfs = 1,
}
local PATH_FIELDS = { { "path", 1 }, { "path", 1, "new_path", 2 } }
for name, pos in pairs(FS) do
  local fields = PATH[name] and PATH_FIELDS[PATH[name]]
  if type(pos) == "table" then
    SPECS[#SPECS + 1] = { name, pos[1], pos[2], K_REQ, "uv_fs", fields }
  else
    SPECS[#SPECS + 1] = { name, pos, 0, K_REQ, "uv_fs", fields }
  end
end

--- What a luv module has, checked before anything is patched: the same
-- list, and so the same messages, on every backend.
local LUV_FUNCS = { "new_check", "check_start", "unref", "run", "loop_alive", "loop_mode" }

--- nil when uv looks like luv, else why not: a refusal key of the api's
-- REFUSED and its arguments.
local function not_luv(uv, where)
  if type(uv) ~= "table" then return "not_luv", where, uv end
  for _, k in ipairs(LUV_FUNCS) do
    if type(uv[k]) ~= "function" then return "luv_lacks", where, k end
  end
end

local M = { SPECS = SPECS, SLOT_OF = SLOT_OF, LUV_FUNCS = LUV_FUNCS, not_luv = not_luv,
  K_HANDLE = K_HANDLE, K_CREATE = K_CREATE, K_CLOSE = K_CLOSE, K_REQ = K_REQ, K_WORK = K_WORK }

-- slot numbers of handle registrations (s.slot): the functions that share
-- a callback slot share the number
local nslots, slot_numbers = 0, {}
for _, s in ipairs(SPECS) do
  if s[4] == K_HANDLE or s[4] == K_CREATE then
    local name = SLOT_OF[s[1]] or s[1]
    if not slot_numbers[name] then
      nslots = nslots + 1
      slot_numbers[name] = nslots
    end
    s.slot = slot_numbers[name]
  end
end

--- The names of every function in SPECS, sorted (a fresh table).
function M.names()
  local t = {}
  for _, s in ipairs(SPECS) do t[#t + 1] = s[1] end
  table.sort(t)
  return t
end

return M
