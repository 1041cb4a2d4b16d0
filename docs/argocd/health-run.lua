-- Argo CD health of a FinetuneJob or InferenceBench (accelbench.io): a run is Healthy once it
-- Succeeded, Degraded when it Failed or cannot start (NameConflict, InvalidSpec), Suspended while
-- suspended or queued, and Progressing until then, so a sync waits for the benchmark to finish.
-- Install: argocd-cm `resource.customizations.health.accelbench.io_FinetuneJob` (and
-- `..._InferenceBench`) set to this file (docs/argocd/argocd-cm.yaml carries both).
local hs = {status = "Progressing", message = "waiting for the operator"}
if obj.status == nil then
  return hs
end
local status = obj.status
-- The generation the operator answered: the status's, or a newer one a condition carries (a run
-- refused before it was applied says so only in its condition).
local seen = status.observedGeneration
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.observedGeneration ~= nil and (seen == nil or c.observedGeneration > seen) then
      seen = c.observedGeneration
    end
  end
end
if obj.metadata.generation ~= nil and seen ~= obj.metadata.generation then
  hs.message = "the operator has not seen generation " .. tostring(obj.metadata.generation) .. " yet"
  return hs
end
local message = status.message or ""
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Stalled" and c.status == "True" then
      return {status = "Degraded", message = c.message or message}
    end
    if (c.type == "Ready" or c.type == "Applied") and c.status == "False"
        and (c.reason == "NameConflict" or c.reason == "InvalidSpec") then
      return {status = "Degraded", message = c.reason .. ": " .. (c.message or message)}
    end
  end
end
if status.phase == "Succeeded" then
  return {status = "Healthy", message = message}
end
if status.phase == "Failed" then
  return {status = "Degraded", message = message}
end
if status.phase == "Suspended" then
  return {status = "Suspended", message = message}
end
hs.message = (status.phase or "Pending") .. ": " .. message
return hs
