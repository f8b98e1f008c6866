# backplane_add_plugin(<target> MANIFEST <manifest.json> SOURCES ...)
#
# Builds a Backplane plugin: a shared library that links only the SDK, exports
# only its entry symbol, and can really be unmapped by dlclose (no
# STB_GNU_UNIQUE symbols, no -z nodelete). The library and its manifest land in
# BACKPLANE_PLUGIN_BUILD_DIR (or the current binary dir) side by side.
function(backplane_add_plugin target)
  cmake_parse_arguments(ARG "" "MANIFEST;OUTPUT_DIR" "SOURCES" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(TARGET Backplane::sdk)
    target_link_libraries(${target} PRIVATE Backplane::sdk)
  endif()
  if(TARGET backplane_warnings)
    target_link_libraries(${target} PRIVATE backplane_warnings)
  endif()
  set(out_dir "${ARG_OUTPUT_DIR}")
  if(NOT out_dir)
    if(BACKPLANE_PLUGIN_BUILD_DIR)
      set(out_dir "${BACKPLANE_PLUGIN_BUILD_DIR}")
    else()
      set(out_dir "${CMAKE_CURRENT_BINARY_DIR}")
    endif()
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY "${out_dir}")
  target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-fno-gnu-unique>)
  target_link_options(${target} PRIVATE -Wl,--no-undefined -Wl,-z,now)
  if(ARG_MANIFEST)
    get_filename_component(manifest_name "${ARG_MANIFEST}" NAME)
    get_filename_component(manifest_dir "${ARG_MANIFEST}" DIRECTORY)
    get_filename_component(manifest_stem "${ARG_MANIFEST}" NAME_WE)
    if(EXISTS "${ARG_MANIFEST}")
      # Copied at configure time and again whenever it changes (a manifest
      # edit alone does not relink the library, so a POST_BUILD copy missed it).
      configure_file("${ARG_MANIFEST}" "${out_dir}/${manifest_name}" COPYONLY)
    else()
      # Made during the build: placed after the library.
      add_custom_command(TARGET ${target} POST_BUILD
        COMMAND ${CMAKE_COMMAND} -E copy_if_different "${ARG_MANIFEST}" "${out_dir}/${manifest_name}"
        COMMENT "Placing manifest ${manifest_name} beside ${target}")
    endif()
    # A bring-up list of expected conformance failures travels with it.
    if(EXISTS "${manifest_dir}/${manifest_stem}.xfail")
      configure_file("${manifest_dir}/${manifest_stem}.xfail" "${out_dir}/${manifest_stem}.xfail" COPYONLY)
    endif()
    set_property(TARGET ${target} PROPERTY BACKPLANE_MANIFEST "${ARG_MANIFEST}")
  endif()
endfunction()
