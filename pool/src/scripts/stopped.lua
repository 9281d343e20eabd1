-- Records that a worker stopped a job on request: ownership and payload
-- removed, inbox entry removed, dispatcher answered.
-- KEYS: base, 9 worker inbox, 10 reply stream
-- ARGV: base, 4 job key, 5 worker id, 6 inbox entry id, 7 reply request (0)
-- Returns 'ok' | 'not_found'
local key = ARGV[4]
local status = 'not_found'
if owner_of(mget(JOBS, key)) == ARGV[5] then
  mdel(JOBS, key)
  redis.call('HDEL', PAYLOADS, key)
  status = 'ok'
end
stream_remove(KEYS[9], ARGV[6])
if ARGV[7] ~= '0' then
  stream_add(KEYS[10], 'reply', ARGV[7] .. ' ' .. status, 1000)
end
return status
