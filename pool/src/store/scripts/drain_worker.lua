-- Sets or clears the drain mark of a worker: the field "drained_at_ms"
-- (server time) of its record in the workers map. A drained worker stays
-- registered and renewing but is out of the ring on every node, and no
-- script gives it a job (`worker_active` in base.lua); its node hands its
-- running jobs to other workers by the rebalance path.
-- KEYS: base
-- ARGV: base, 4 worker id, 5 'drain' | 'undrain'
-- Returns 'changed' | 'unchanged' | 'unknown' (not registered)
-- | 'malformed' (the record is not a JSON object).
local worker, drain = ARGV[4], ARGV[5] == 'drain'
local record = mget(WORKERS, worker)
if not record then return 'unknown' end
local ok, info = pcall(cjson.decode, record)
if not ok or type(info) ~= 'table' then return 'malformed' end
if (info['drained_at_ms'] ~= nil) == drain then return 'unchanged' end
if drain then
  info['drained_at_ms'] = now_ms()
else
  info['drained_at_ms'] = nil
end
mset(WORKERS, worker, cjson.encode(info))
return 'changed'
