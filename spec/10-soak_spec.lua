-- Soak: many requests through the demo server shape under wrk, with an
-- AsyncLocal and all hooks enabled.  No error, no lost or mixed context
-- (the server checks every response against the id in its own request),
-- flat RSS.  AH_SOAK_SECONDS sets the duration (3 here; `make soak`: 60).
describe("soak", function()
  it("serves every request with its own context, in flat memory", function()
    local seconds = tonumber(os.getenv("AH_SOAK_SECONDS")) or 3
    local out = os.tmpname()
    os.execute(("lua5.4 spec/support/soak_server.lua > %s 2>&1 & echo $! > %s.pid"):format(out, out))
    local port
    for _ = 1, 100 do
      local f = io.open(out)
      port = f and f:read("a"):match("PORT (%d+)")
      if f then f:close() end
      if port then break end
      os.execute("sleep 0.05")
    end
    assert.truthy(port, "the server started")
    local w = io.popen(("wrk -t1 -c64 -d%ds -s spec/support/soak_wrk.lua http://127.0.0.1:%s/ 2>&1")
      :format(seconds, port))
    local report = w:read("a")
    w:close()
    local pid = io.open(out .. ".pid"):read("l")
    os.execute("kill " .. pid)
    local stats
    for _ = 1, 100 do
      local f = io.open(out)
      stats = f:read("a"):match("STATS ([^\n]+)")
      f:close()
      if stats then break end
      os.execute("sleep 0.05")
    end
    os.remove(out)
    os.remove(out .. ".pid")
    print(("\n  soak: %s\n  wrk: %s"):format(tostring(stats), report:match("(%d+ requests in [^\n]+)") or report))
    assert.truthy(stats, "the server reported")
    local served = tonumber(stats:match("served=(%d+)"))
    local mismatches = tonumber(stats:match("mismatches=(%d+)"))
    local warm, final = tonumber(stats:match("rss_warm=(%d+)")), tonumber(stats:match("rss_end=(%d+)"))
    assert.is_true(served > 10000, "requests served: " .. served)
    assert.equal(0, mismatches)
    assert.is_nil(report:match("Non%-2xx"), "non-2xx responses")
    assert.is_nil(report:match("Socket errors: connect"), "connect errors")
    if warm > 0 then
      assert.is_true(final < warm * 1.25 + 2048, ("RSS %d KiB after warm-up, %d KiB at the end"):format(warm, final))
    end
  end)
end)
