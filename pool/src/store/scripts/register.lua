-- Registers (or re-registers) a worker with its creation time on server
-- time and a first keep-alive. A drain mark on an existing record is kept
-- (see drain_worker.lua).
-- KEYS: base, 9 keepalive hash, 10 keepalive revision
-- ARGV: base, 4 worker id, 5 worker info (JSON object), 6 keepalive channel
-- Returns the server time in ms.
local now = now_ms()
local info = cjson.decode(ARGV[5])
info['created_at_ms'] = now
local old = mget(WORKERS, ARGV[4])
if old then
  local ok, prev = pcall(cjson.decode, old)
  if ok and type(prev) == 'table' and prev['drained_at_ms'] then
    info['drained_at_ms'] = prev['drained_at_ms']
  end
end
mset(WORKERS, ARGV[4], cjson.encode(info))
rmap_set(KEYS[9], KEYS[10], ARGV[6], ARGV[4], string.format('%d', now))
return now
