-- Records that a worker stopped a job on request: ownership and payload
-- removed, inbox entry removed, dispatcher answered.
-- KEYS: base, 9 worker inbox, 10 reply stream
-- ARGV: base, 4 job key, 5 worker id, 6 inbox entry id, 7 reply request (0)
-- Returns 'ok' | 'retry' (the job moved on or is about to start elsewhere:
-- the dispatcher sends the request again) | 'not_found'
local key = ARGV[4]
local status = 'not_found'
local owner = owner_of(mget(JOBS, key))
if owner == ARGV[5] then
  mdel(JOBS, key)
  redis.call('HDEL', PAYLOADS, key)
  status = 'ok'
elseif owner or mget(PENDING, key) then
  status = 'retry'
end
stream_remove(KEYS[9], ARGV[6])
if ARGV[7] ~= '0' then
  stream_add(KEYS[10], 'reply', ARGV[7] .. ' ' .. status, 1000)
end
return status
