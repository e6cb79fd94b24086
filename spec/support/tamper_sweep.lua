--- Runs spec/support/tamper.lua over a range of its cases, in as many
-- processes as it takes: a process that a case ended (a crash, an exit, a
-- hang) is reported with that case, and the next process starts at the
-- case after it.
--   lua5.4 spec/support/tamper_sweep.lua MODE [FIRST [LAST [STRIDE]]]   (prints)
--   require("support.tamper_sweep").sweep(lua, mode, first, last, stride)
local M = {}

local DRIVER = "spec/support/tamper.lua"
local TIMEOUT = 120 -- seconds per process (a case takes milliseconds)

local function slurp(p)
  local h = io.open(p)
  local s = h and h:read("a") or ""
  if h then h:close() end
  os.remove(p)
  return s
end

--- Run cases first..last of the driver in mode (every stride-th: a sample).
-- @param lua the interpreter's command, quoted for the shell
-- @return the number of cases, and a list of {case = i, what = description,
--   status = exit status (128 + signal for a crash, 124 for a hang),
--   stderr = its end}
function M.sweep(lua, mode, first, last, stride)
  local problems, n = {}, nil
  local from = first or 1
  local tmp = os.tmpname()
  while true do
    local cmd = ("ASAN_OPTIONS=detect_leaks=0 timeout %d %s %s %s %d %d %d >%s.out 2>%s.err")
      :format(TIMEOUT, lua, DRIVER, mode, from, last or 1e9, stride or 1, tmp, tmp)
    local _, _, status = os.execute(cmd)
    local out, err = slurp(tmp .. ".out"), slurp(tmp .. ".err")
    n = n or tonumber(out:match("^N (%d+)"))
    local lastcase, what
    for i, d in out:gmatch("CASE (%d+) ([^\n]*)") do lastcase, what = tonumber(i), d end
    if out:match("\nDONE %d+") and status == 0 then break end
    if not lastcase or lastcase < from then -- died before its first case
      problems[#problems + 1] = { case = from, what = "(set-up)", status = status, stderr = err:sub(-600) }
      break
    end
    problems[#problems + 1] = { case = lastcase, what = what, status = status, stderr = err:sub(-600) }
    if last and lastcase >= last then break end
    from = lastcase + 1
    if n and from > n then break end
  end
  os.remove(tmp)
  return n, problems
end

if arg and arg[0] and arg[0]:match("tamper_sweep%.lua$") then
  local mode, first, last, stride = arg[1] or "plain", tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
  local n, problems = M.sweep("lua5.4", mode, first, last, stride)
  print(("%s: %s cases, %d ended a process"):format(mode, tostring(n), #problems))
  for _, p in ipairs(problems) do
    print(("  case %d (status %s): %s"):format(p.case, tostring(p.status), p.what))
    local line = p.stderr:match("([^\n]+)\n?$")
    if line and p.status ~= 139 then print("    " .. line) end
  end
end

return M
