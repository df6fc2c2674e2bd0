#pragma once
// Umbrella header: everything a user of libcomm needs.
#include "libcomm/bootstrap.h"
#include "libcomm/communicator.h"
#include "libcomm/config.h"
#include "libcomm/convert.h"
#include "libcomm/cuda.h"
#include "libcomm/deadline.h"
#include "libcomm/launcher.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"
#include "libcomm/types.h"
#include "libcomm/version.h"
