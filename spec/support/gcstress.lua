-- busted --helper for the GC stress runs (make gcstress):
--   AH_GC_STRESS=step  a collector step every 200 VM instructions, in every
--                      thread (count hooks are inherited by new coroutines)
--   AH_GC_STRESS=gen   generational mode with frequent minor collections
local mode = os.getenv("AH_GC_STRESS") or "step"
if mode == "gen" then
  collectgarbage("generational", 5, 50)
else
  collectgarbage("incremental", 50, 100, 10)
  debug.sethook(function() collectgarbage("step", 1) end, "", 200)
end
